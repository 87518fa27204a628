"""Regenerate docs/img/memory_timeline.png: the memory timeline of a real training step.

A two-layer GPT-2 (random weights from a ``transformers`` config, nothing downloaded)
takes two AdamW training steps on a 4 x 32 batch of random tokens under
``layerscope.Profiler``; the profile is saved as JSON, then drawn with the CLI::

    python docs/img/make_memory_timeline.py            # writes docs/img/memory_timeline.png
    python docs/img/make_memory_timeline.py out.png    # or somewhere else

Needs ``pip install 'layerscope[plot,transformers]'``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import layerscope
from layerscope.cli import main as layerscope_cli

HERE = Path(__file__).resolve().parent


def profile_gpt2_steps(json_path: str, steps: int = 2) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # times less at the mercy of whatever else the machine runs
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=64)
    model = GPT2LMHeadModel(config).train()
    input_ids = torch.randint(0, config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with layerscope.Profiler(model) as prof:
        for _ in range(steps):
            loss = model(input_ids, labels=input_ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    prof.profile.save(json_path)


def main(argv: list[str]) -> int:
    out = argv[0] if argv else str(HERE / "memory_timeline.png")
    json_path = os.path.join(tempfile.gettempdir(), "gpt2_step.json")
    profile_gpt2_steps(json_path)
    # The same as: layerscope plot-memory /tmp/gpt2_step.json -o docs/img/memory_timeline.png
    return layerscope_cli(["plot-memory", json_path, "-o", out])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
