"""A small DDP training run profiled on every rank: the distributed example.

::

    torchrun --standalone --nproc_per_node=2 -m layerscope.examples.ddp_train run/
    layerscope merge run/layerscope_steps7-9_rank*.json -o merged.json
    layerscope show merged.json

Each rank writes one ``layerscope/1`` file per schedule cycle into the folder
(``layerscope_steps{a}-{b}_rank{r}.json``), and ``layerscope.handlers.gather`` also
collects each cycle on rank 0 into ``FOLDER/merged/``. ``--straggler-ms N`` makes one
module (``module.2``, a no-op ``Delay``) sleep N ms per forward on the last rank: the
straggler the merged report names. Runs on CPU with the gloo backend (NCCL when CUDA
is available and ``--backend nccl``).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

import layerscope
from layerscope.model.tree import Profile

#: Two cycles after one idle step: warm up 1, record 3.
SCHEDULE = {"wait": 1, "warmup": 1, "active": 3, "repeat": 2}
STEPS = 11


class Delay(nn.Module):
    """Sleeps ``ms`` milliseconds per forward on rank ``rank``; a no-op elsewhere."""

    def __init__(self, ms: float, rank: int) -> None:
        super().__init__()
        self.ms = ms
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ms and dist.get_rank() == self.rank:
            time.sleep(self.ms / 1000)
        return x


def model(straggler_ms: float = 0.0, slow_rank: int = 1) -> nn.Sequential:
    """Linear(64, 128), ReLU, Delay, Linear(128, 10): 9,610 parameters, 38,440 bytes of
    float32 gradients to all-reduce per step."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), Delay(straggler_ms, slow_rank), nn.Linear(128, 10))


def _both(*handlers: Callable[[Profile], object]) -> Callable[[Profile], None]:
    def on_ready(profile: Profile) -> None:
        for handler in handlers:
            handler(profile)

    return on_ready


def train(
    folder: str, *, straggler_ms: float = 0.0, device: str = "cpu", gather_timeout: float = 60.0
) -> None:
    """Train :func:`model` for ``STEPS`` steps under DDP, profiled on this rank."""
    net = model(straggler_ms, dist.get_world_size() - 1).to(device)
    ddp = nn.parallel.DistributedDataParallel(
        net, device_ids=None if device == "cpu" else [torch.device(device).index]
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(16, 64, device=device)
    y = torch.randint(0, 10, (16,), device=device)
    on_ready = _both(
        layerscope.handlers.save_json(folder),
        layerscope.handlers.gather(os.path.join(folder, "merged"), timeout=gather_timeout),
    )
    with layerscope.Profiler(ddp, schedule=layerscope.schedule(**SCHEDULE), on_ready=on_ready) as prof:
        for _ in range(STEPS):
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m layerscope.examples.ddp_train",
        description="A small DDP training run profiled on every rank (start it with torchrun).",
    )
    parser.add_argument("folder", help="where each rank writes its profiles")
    parser.add_argument(
        "--straggler-ms", type=float, default=0.0, help="sleep this long in module.2 on the last rank"
    )
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error(
            "start it with torchrun, e.g. torchrun --standalone --nproc_per_node=2 -m layerscope.examples.ddp_train run/"
        )
    torch.set_num_threads(1)
    device = "cpu"
    if args.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group(args.backend)
    try:
        train(args.folder, straggler_ms=args.straggler_ms, device=device)
    finally:
        # DDP's reducer must be gone before its process group: left to interpreter exit,
        # their teardown can abort the process ("terminate called without an active
        # exception", torch 2.13 with gloo).
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
