"""One name per thing in every view: what a figure is called and what it covers are the
same in the text tree, its footer, the HTML report and the op tables."""

from __future__ import annotations

import torch
from torch import nn

import layerscope


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_container_never_called_shows_no_peak_of_its_own() -> None:
    """The ModuleList is indexed, never called: no interval of its own, so no peak
    (blank, None), while its children, called, have theirs."""
    profile = layerscope.check_tree(layerscope.profile(_Blocks(), torch.randn(8, 64), backward=True, warmup=0, repeat=1))
    blocks = profile["blocks"]
    assert blocks.calls == 0
    assert [stats.peak_bytes for _, stats in blocks.phases()] == [None, None]
    assert all(stats.peak_bytes is not None for _, stats in profile["blocks.0"].phases())
