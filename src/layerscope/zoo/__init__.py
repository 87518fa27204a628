"""Built-in model zoo: small registry of hand-written reference models.

Every model is built with random weights from plain ``torch.nn`` so the zoo
works offline and without torchvision, while the module layouts mirror
torchvision's so profiles can be compared against published per-layer numbers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["ZOO", "Builder", "ZooEntry", "get", "names", "register"]

Builder = Callable[[], nn.Module]


@dataclass(frozen=True)
class ZooEntry:
    name: str
    description: str
    build: Builder
    # batch_size -> a Tensor, a tuple of positional args, or a dict of kwargs.
    example_inputs: Callable[[int], Any]


ZOO: dict[str, ZooEntry] = {}


def register(
    name: str, description: str, example_inputs: Callable[[int], Any]
) -> Callable[[Builder], Builder]:
    """Decorator registering a builder function under ``name``.

    The builder is returned unchanged so it stays directly callable.
    """

    def decorator(build: Builder) -> Builder:
        # Fail loudly: silently replacing an entry would make profiles of
        # "the same" model name disagree depending on import order.
        if name in ZOO:
            raise ValueError(f"zoo model {name!r} is already registered")
        ZOO[name] = ZooEntry(
            name=name,
            description=description,
            build=build,
            example_inputs=example_inputs,
        )
        return build

    return decorator


def get(name: str) -> ZooEntry:
    """Return the entry for ``name``; unknown names list the alternatives."""
    try:
        return ZOO[name]
    except KeyError:
        available = ", ".join(names())
        raise KeyError(f"unknown zoo model {name!r}; available: {available}") from None


def names() -> list[str]:
    return sorted(ZOO)


# Imported last: the family modules need ``register`` defined above, and
# importing them is what fills the registry. import_module keeps this free of
# lint suppressions for late and "unused" imports.
_FAMILIES = ("alexnet", "gpt", "lenet", "mlp", "resnet", "vit")
for _family in _FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
del _family
