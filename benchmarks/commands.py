"""Cold start of the commands that run no model: how long ``layerscope ARGS`` takes in a
fresh process, and whether it imported torch.

    python -m benchmarks.commands [--rounds 5] [--trace PATH]

Each command runs ``--rounds`` times as ``python -m layerscope ARGS`` in a new process
(rounds interleave the commands, so a busy moment of the machine is spread over all of
them); reported: the median wall time of each, its exit status, and whether ``torch``
was among the modules it imported (one extra run under ``python -X importtime``). A
saved profile (``x.json``, from ``layerscope profile zoo:mlp``) and two rank files made
from it are written to a temporary folder first; ``--trace`` names a torch.profiler
trace to ``show`` (skipped when the file is not there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "h100_ddp_nccl_train.json.gz"


def _commands(folder: Path, trace: Path) -> list[list[str]]:
    commands = [
        ["--help"],
        ["profile", "--help"],
        ["zoo"],
        ["profile", "zoo:nope"],
        ["profile", "nosuch.module:Model"],
        ["show", "x.json"],
        ["show", "x.json", "--format", "ops"],
        ["diff", "x.json", "x.json"],
        ["merge", "rank0.json", "rank1.json"],
    ]
    if trace.is_file():
        commands.append(["show", str(trace)])
    return commands


def _layerscope(args: list[str], folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-m", "layerscope", *args], cwd=folder, capture_output=True, text=True, check=False,
    )


def _rank_files(folder: Path) -> None:
    """Two ranks of one run, from one saved profile (the same tree, its rank facts set)."""
    saved = json.loads((folder / "x.json").read_text())
    for rank in (0, 1):
        saved["meta"].update(rank=rank, world_size=2, run_id="bench")
        (folder / f"rank{rank}.json").write_text(json.dumps(saved))


def _imports_torch(args: list[str], folder: Path) -> bool:
    lines = _layerscope(args, folder, "-X", "importtime").stderr.splitlines()
    return any(line.startswith("import time:") and line.split("|")[-1].strip() == "torch" for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        made = _layerscope(["profile", "zoo:mlp", "--warmup", "0", "--repeat", "1", "-o", "x.json"], folder)
        if made.returncode != 0:
            raise SystemExit(made.stderr)
        _rank_files(folder)
        commands = _commands(folder, args.trace)
        times: dict[int, list[float]] = {i: [] for i in range(len(commands))}
        status: dict[int, int] = {}
        for _ in range(args.rounds):
            for i, command in enumerate(commands):
                start = time.perf_counter()
                done = _layerscope(command, folder)
                times[i].append(time.perf_counter() - start)
                status[i] = done.returncode
        print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
              f"medians of {args.rounds} cold runs")
        print(f"{'command':<48} {'median':>8} {'exit':>4}  torch")
        for i, command in enumerate(commands):
            shown = " ".join(Path(a).name if "/" in a else a for a in command)
            torch = "yes" if _imports_torch(command, folder) else "no"
            print(f"layerscope {shown:<37} {statistics.median(times[i]):>7.2f}s {status[i]:>4}  {torch}")


if __name__ == "__main__":
    main()
