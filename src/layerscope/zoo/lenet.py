"""LeNet-5 (LeCun et al., 1998) in its common modern simplification."""

from __future__ import annotations

import torch
from torch import nn


class LeNet5(nn.Module):
    # Tanh + average pooling keeps it faithful to the original network rather
    # than the ReLU/max-pool variants, so it stays a distinct profiling case.
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, kernel_size=5),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5),
            nn.Tanh(),
            nn.AvgPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120),
            nn.Tanh(),
            nn.Linear(120, 84),
            nn.Tanh(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def example_inputs(batch_size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch_size, 1, 32, 32, generator=g, dtype=torch.float32)


def lenet5() -> nn.Module:
    return LeNet5()
