"""The capture layer: the only code that touches torch while a model runs."""
