"""Cold start of the commands that run no model: how long ``layerscope ARGS`` takes in a
fresh process, and whether it imported torch.

    python -m benchmarks.commands [--rounds 5] [--trace PATH] [--against OTHER/src]

Each command runs ``--rounds`` times as ``python -m layerscope ARGS`` in a new process
(rounds interleave the commands, so a busy moment of the machine is spread over all of
them); reported: the median wall time of each, its exit status, and whether ``torch``
was among the modules it imported (one extra run under ``python -X importtime``). A
saved profile (``x.json``, from ``layerscope profile zoo:mlp``) and two rank files made
from it are written to a temporary folder first; ``--trace`` names a torch.profiler
trace to ``show`` (skipped when the file is not there). ``--against`` names another
checkout's ``src`` folder (``git worktree add`` of an older commit): its layerscope runs
each command in the same rounds, side by side with this one.
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

_SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
#: A trace with recorded shapes (its FLOPs counted: torch imported) and one without.
DEFAULT_TRACES = [_SHARED / "h100_ddp_nccl_train.json.gz", _SHARED / "a100_alexnet_no_modules.json.gz"]


def _commands(folder: Path, traces: list[Path]) -> list[list[str]]:
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
    for trace in traces:
        if trace.is_file():
            # The full read counts FLOPs from the recorded shapes (torch imported); the
            # same file read without them (--no-shapes) imports none.
            commands += [["show", str(trace)], ["show", str(trace), "--no-shapes"]]
    return commands


HERE = Path(__file__).resolve().parents[1] / "src"


def _layerscope(args: list[str], folder: Path, *flags: str, src: Path = HERE) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [sys.executable, *flags, "-m", "layerscope", *args], cwd=folder, env=env, capture_output=True, text=True,
        check=False,
    )


def _rank_files(folder: Path) -> None:
    """Two ranks of one run, from one saved profile (the same tree, its rank facts set)."""
    saved = json.loads((folder / "x.json").read_text())
    for rank in (0, 1):
        saved["meta"].update(rank=rank, world_size=2, run_id="bench")
        (folder / f"rank{rank}.json").write_text(json.dumps(saved))


def _imports_torch(args: list[str], folder: Path, src: Path) -> bool:
    lines = _layerscope(args, folder, "-X", "importtime", src=src).stderr.splitlines()
    return any(line.startswith("import time:") and line.split("|")[-1].strip() == "torch" for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    # Resolved here: the commands run in a folder of their own.
    parser.add_argument("--trace", type=lambda path: Path(path).resolve(), action="append",
                        help="a trace to show (again for more); default: a shared trace with shapes and one without")
    parser.add_argument("--against", type=Path, help="another checkout's src folder, run side by side")
    args = parser.parse_args()
    sources = {"this": HERE, **({"against": args.against.resolve()} if args.against else {})}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        made = _layerscope(["profile", "zoo:mlp", "--warmup", "0", "--repeat", "1", "-o", "x.json"], folder)
        if made.returncode != 0:
            raise SystemExit(made.stderr)
        _rank_files(folder)
        commands = _commands(folder, args.trace or DEFAULT_TRACES)
        times: dict[tuple[str, int], list[float]] = {(s, i): [] for s in sources for i in range(len(commands))}
        status: dict[tuple[str, int], int] = {}
        for _ in range(args.rounds):
            for i, command in enumerate(commands):
                for source, src in sources.items():
                    start = time.perf_counter()
                    done = _layerscope(command, folder, src=src)
                    times[source, i].append(time.perf_counter() - start)
                    status[source, i] = done.returncode
        print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
              f"medians of {args.rounds} cold runs; " + ", ".join(f"{s}: {src}" for s, src in sources.items()))
        shown_all = [" ".join(Path(a).name if "/" in a else a for a in command) for command in commands]
        width = max(37, *(len(shown) for shown in shown_all))
        print(f"{'command':<{width + 11}} " + " ".join(f"{s:>8} {'exit':>4} {'torch':>5}" for s in sources))
        for i, (command, shown) in enumerate(zip(commands, shown_all)):
            cells = [
                f"{statistics.median(times[s, i]):>7.2f}s {status[s, i]:>4} "
                f"{'yes' if _imports_torch(command, folder, src) else 'no':>5}"
                for s, src in sources.items()
            ]
            print(f"layerscope {shown:<{width}} " + " ".join(cells))


if __name__ == "__main__":
    main()
