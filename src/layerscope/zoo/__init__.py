"""Built-in model zoo: small registry of hand-written reference models.

Every model is built with random weights from plain ``torch.nn`` so the zoo
works offline and without torchvision, while the module layouts mirror
torchvision's so profiles can be compared against published per-layer numbers.

The built-in entries are declared here, by name and description, and their family
modules (which define the ``nn.Module`` classes, so import torch) are imported only
when a model is built or its inputs made: ``layerscope zoo`` lists them without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["ZOO", "Builder", "ZooEntry", "get", "names", "register"]

Builder = Callable[[], "nn.Module"]


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


class _Deferred:
    """``layerscope.zoo.<family>``'s function ``attribute``, imported on first call."""

    def __init__(self, family: str, attribute: str) -> None:
        self.family = family
        self.attribute = attribute

    def __call__(self, *args: Any) -> Any:
        module = importlib.import_module(f"{__name__}.{self.family}")
        return getattr(module, self.attribute)(*args)

    def __repr__(self) -> str:
        return f"{__name__}.{self.family}.{self.attribute}"


#: The built-in models: name, description, and the family module whose function of the
#: same name builds the model and whose ``example_inputs`` makes its inputs.
_BUILT_IN = (
    ("alexnet", "AlexNet (torchvision layout), 3x224x224 images, 1000 classes, 61.1M params", "alexnet"),
    ("gpt", "Small GPT decoder: 4 layers, d_model 128, 4 heads, vocab 1000, tied lm_head", "gpt"),
    ("lenet5", "LeNet-5 (tanh, avg-pool) for 1x32x32 images, 10 classes, 61.7K params", "lenet"),
    ("mlp", "Plain MLP 64-256-256-10 with ReLU, 85K params", "mlp"),
    ("resnet18", "ResNet-18 (torchvision layout), 3x224x224 images, 1000 classes, 11.7M params", "resnet"),
    ("resnet50", "ResNet-50 v1.5 (torchvision layout), 3x224x224 images, 1000 classes, 25.6M params", "resnet"),
    ("vit_b_16", "ViT-B/16 (torchvision layout), 3x224x224 images, 1000 classes, 86.6M params", "vit"),
)
for _name, _description, _family in _BUILT_IN:
    register(_name, _description, _Deferred(_family, "example_inputs"))(_Deferred(_family, _name))
del _name, _description, _family
