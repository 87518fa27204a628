"""A plain multi-layer perceptron: the simplest possible profiling target."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(
        self, in_features: int = 64, hidden: int = 256, num_classes: int = 10
    ) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def example_inputs(batch_size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch_size, 64, generator=g, dtype=torch.float32)


def mlp() -> nn.Module:
    return MLP()
