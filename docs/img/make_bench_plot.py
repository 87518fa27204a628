"""Regenerate docs/img/bench.png: latency and throughput of a real model against batch size.

The built-in ``zoo:mlp`` (random weights) is benchmarked for inference at batch sizes
1, 2, 4, 8, 16 and 32 on this machine's CPU, on one thread (on a small VM whose other
core is busy, two threads wait on each other in 4 ms scheduler slices and the picture
shows the machine, not the model), then drawn::

    python docs/img/make_bench_plot.py            # writes docs/img/bench.png (and prints the table)
    python docs/img/make_bench_plot.py out.png    # or somewhere else

Needs ``pip install 'layerscope[plot]'``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import layerscope
from layerscope import zoo
from layerscope.render.plot import plot_bench

HERE = Path(__file__).resolve().parent


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "bench.png"
    entry = zoo.get("mlp")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = entry.build().eval()
    result = layerscope.benchmark(model, entry.example_inputs(1), [1, 2, 4, 8, 16, 32], min_runs=20, min_time_s=0.5)
    result.model = "zoo:mlp"
    print(result.render())
    plot_bench(result, target)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
