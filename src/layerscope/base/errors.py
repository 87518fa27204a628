"""The errors layerscope raises for bad input. Each names what was wrong and what was
expected; the CLI prints the message alone (``--debug`` adds the traceback)."""

from __future__ import annotations


class LayerscopeError(Exception):
    """Base of every error layerscope raises on purpose."""


class ModelError(LayerscopeError, TypeError):
    """The thing to profile is not an ``nn.Module``."""


class InputsError(LayerscopeError, TypeError):
    """The inputs do not fit the model's ``forward`` signature, or cannot be parsed."""


class DispatchModeError(LayerscopeError, RuntimeError):
    """The model runs an op layerscope's dispatch mode cannot run (a higher-order op:
    ``flex_attention``, ``cond``), and torch's profiler, which counts such a model
    instead, is held by another profiler: ``count_flops`` cannot count it now; the
    message names the op and why."""


class SpecError(LayerscopeError, ValueError):
    """A model or inputs SPEC cannot be resolved to a module or inputs."""


class SchemaError(LayerscopeError, ValueError):
    """A file is not a layerscope profile, or is of a schema this version cannot read."""


class ProfilerStateError(LayerscopeError, RuntimeError):
    """A profiler is used out of order (nested on one model, read before it finished)."""


class RenderError(LayerscopeError, ValueError):
    """A format cannot be drawn from this profile (it has no trace, or lacks a metric)."""


class OptionError(LayerscopeError, TypeError):
    """A format is given an option it does not take; the message names those it does."""


class MergeError(LayerscopeError, ValueError):
    """Profiles that cannot be merged into one run: other runs, models, world sizes or
    cycles, or the same rank twice. The message names what differs and what was expected."""


class MissingDependencyError(LayerscopeError, ImportError):
    """An optional package a feature needs is not installed. ``package`` is the package,
    ``install`` the command that gets it (the project's extra, which pins its version),
    ``feature`` what needed it; the CLI names the command the user ran instead."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        self.feature = feature
        self.package = package
        self.install = f"pip install 'layerscope[{extra}]' (or pip install {package})"
        super().__init__(f"{feature} needs {package}: {self.install}")


class TraceModelError(LayerscopeError, ValueError):
    """The model given to read a trace file with is not the one the trace recorded: a
    module's parameters have shapes none of its ops were given. The message names the
    module, its parameters' shapes and the shapes the trace shows."""


class LayerscopeWarning(UserWarning):
    """Something layerscope did that a user should know of, without stopping (a model
    that fits a trace only in part). The command line prints it as one line."""
