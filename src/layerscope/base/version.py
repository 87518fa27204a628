"""layerscope's version: here, at the bottom, so every layer can name it without
importing the package root (which imports the layers above it)."""

__version__ = "0.1.0"
