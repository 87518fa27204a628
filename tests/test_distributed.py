"""Distributed runs with real processes: 2 ranks on the gloo backend, one thread each.

The workers are tests/dist_worker.py, started under ``torchrun --standalone`` (the DDP
and Trainer runs) or as two plain processes (the run where a rank dies: torchrun stops
every worker as soon as one fails, and the point is what the survivors do).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import layerscope
from layerscope.model.check import check_tree
from processes import run_layerscope

WORKER = Path(__file__).with_name("dist_worker.py")
pytestmark = [
    pytest.mark.skipif(not __import__("torch").distributed.is_available(), reason="needs torch.distributed"),
    pytest.mark.slow,  # torchrun jobs of two ranks
]

#: Parameters of layerscope.examples.ddp_train.model: Linear(64, 128) and Linear(128, 10).
GRAD_BYTES = ((64 * 128 + 128) + (128 * 10 + 10)) * 4
STRAGGLER_MS = 40.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env.pop("LAYERSCOPE_RUN_ID", None)
    return env


def torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    torchrun("-m", "layerscope.examples.ddp_train", str(out), "--straggler-ms", str(STRAGGLER_MS))
    return out


def _cycles(folder: Path) -> dict[tuple[str, int], layerscope.Profile]:
    found = {}
    for path in sorted(folder.glob("layerscope_steps*_rank*.json")):
        profile = layerscope.load(path)
        found[(f"{profile.meta.step_range[0]}-{profile.meta.step_range[1]}", profile.meta.rank)] = (
            profile
        )
    return found


def test_one_valid_distinct_file_per_rank_and_cycle(ddp_run: Path) -> None:
    names = sorted(p.name for p in ddp_run.glob("*.json"))
    assert names == [
        "layerscope_steps2-4_rank0.json", "layerscope_steps2-4_rank1.json",
        "layerscope_steps7-9_rank0.json", "layerscope_steps7-9_rank1.json",
    ]
    cycles = _cycles(ddp_run)
    run_ids = {p.meta.run_id for p in cycles.values()}
    assert len(run_ids) == 1 and len(run_ids.pop()) >= 8  # one run id, shared by every file
    for (_, rank), profile in cycles.items():
        check_tree(profile)
        assert profile.meta.world_size == 2
        assert profile.meta.local_rank == rank
        assert profile.meta.host == socket.gethostname()
        assert profile.meta.complete is True
    texts = {(ddp_run / n).read_text() for n in names}
    assert len(texts) == 4


def test_allreduce_traffic_is_the_gradient_bytes_per_step(ddp_run: Path) -> None:
    for (steps, rank), profile in _cycles(ddp_run).items():
        backward = profile.root.backward
        assert backward is not None
        # DDP all-reduces every gradient once per step; the detail step's collectives
        # stand for each of the cycle's timed steps.
        assert backward.comm_bytes == GRAD_BYTES * profile.figures.steps, (steps, rank)
        collectives = [op for node in profile.root.walk() for op in node.ops if op.name == "c10d::allreduce_"]
        assert collectives and sum(op.bytes for op in collectives) == backward.comm_bytes
        assert backward.comm_time_ns and backward.comm_time_ns > 0
        # The collective is started from a gradient hook: it sits under a module's backward.
        assert all(op.phase == "backward" for op in collectives)


def test_gather_writes_one_merged_file_per_cycle(ddp_run: Path) -> None:
    merged = sorted(p.name for p in (ddp_run / "merged").glob("*.json"))
    assert merged == ["layerscope_steps2-4_ranks.json", "layerscope_steps7-9_ranks.json"]
    report = layerscope.load(ddp_run / "merged" / merged[1])
    assert report.rank_numbers == [0, 1]
    assert not report.missing_ranks
    # The gathered report is the merge of the cycle's rank files (which module straggles
    # in a live run is timing: test_ranks.py checks it on a recorded run).
    files = [layerscope.load(p) for p in sorted(ddp_run.glob("layerscope_steps7-9_rank*.json"))]
    merged_here = layerscope.merge(files).stragglers()
    assert [(s.path, s.rank) for s in report.stragglers()] == [(s.path, s.rank) for s in merged_here]


def test_merge_cli_on_the_rank_files(ddp_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged.json"
    files = [str(p) for p in sorted(ddp_run.glob("layerscope_steps7-9_rank*.json"))]
    done = run_layerscope(["merge", *files, "-o", str(out)], tmp_path, env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    shown = run_layerscope(["show", str(out)], tmp_path, env=_env(), timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "module.2" in shown.stdout


def test_trainer_callback_under_torchrun(tmp_path: Path) -> None:
    torchrun(str(WORKER), "trainer", str(tmp_path))
    files = sorted((tmp_path / "layerscope").glob("*.json"))
    assert [p.name for p in files] == ["layerscope_steps2-4_rank0.json", "layerscope_steps2-4_rank1.json"]
    profiles = [layerscope.load(p) for p in files]
    assert [p.meta.rank for p in profiles] == [0, 1]
    assert profiles[0].meta.run_id == profiles[1].meta.run_id
    for profile in profiles:
        check_tree(profile)
        assert profile.meta.world_size == 2
        # One bucket holds every gradient: one all-reduce of all their bytes per step
        # (the Trainer's DDP also all-reduces its map of used parameters, a few bytes).
        steps = profile.figures.steps
        payloads = [op.bytes for n in profile.root.walk() for op in n.ops if op.name == "c10d::allreduce_"]
        assert steps * profile.param_bytes in payloads, (payloads, profile.param_bytes)


def test_a_rank_dies(tmp_path: Path) -> None:
    """Rank 1 raises in the second cycle. Rank 0's cycles are intact, both ranks' first
    cycle is merged, and the second cycle's gather times out naming rank 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = _env() | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), "die", str(tmp_path)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        ))
    outs = [p.communicate(timeout=240) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes[0] == 0, outs[0][1][-3000:]
    assert codes[1] != 0 and "rank 1 fails on purpose" in outs[1][1]
    names = sorted(p.name for p in tmp_path.glob("layerscope_*.json"))
    assert "layerscope_steps2-4_rank0.json" in names and "layerscope_steps2-4_rank1.json" in names
    assert "layerscope_steps7-9_rank0.json" in names
    for name in names:
        check_tree(layerscope.load(tmp_path / name))
    assert "sent no profile for steps 7-9 within 3s" in outs[0][1]
    first = layerscope.load(tmp_path / "merged" / "layerscope_steps2-4_ranks.json")
    assert first.rank_numbers == [0, 1]
    second = layerscope.load(tmp_path / "merged" / "layerscope_steps7-9_ranks.json")
    assert second.rank_numbers == [0] and second.missing_ranks == [1]


def test_profiling_rank_0_alone_does_not_wait_for_the_others(tmp_path: Path) -> None:
    torchrun(str(WORKER), "rank0", str(tmp_path), timeout=120)
    profile = layerscope.load(tmp_path / "rank0.json")
    assert profile.meta.rank == 0 and profile.meta.world_size == 2 and profile.meta.run_id


def test_fsdp_collectives_sit_under_the_modules_that_ran_them(tmp_path: Path) -> None:
    """FSDP2 all-gathers each unit's parameters in its forward pre-hook and reduce-scatters
    its gradients after its backward: every byte is counted, once per step, and the
    hooks' labels are forward or backward work, never recompute."""
    torchrun(str(WORKER), "fsdp", str(tmp_path))
    for rank in range(2):
        profile = layerscope.load(tmp_path / f"fsdp_rank{rank}.json")
        check_tree(profile)
        steps = profile.figures.steps
        assert profile.param_bytes == GRAD_BYTES  # the unsharded model's
        rows = [(node, op) for tree in [profile.root, *profile.parts] for node in tree.walk() for op in node.ops]
        gathered = sum(op.bytes for node, op in rows if op.name == "c10d::_allgather_base_" and op.phase == "forward")
        scattered = sum(op.bytes for node, op in rows if op.name == "c10d::_reduce_scatter_base_")
        assert gathered == steps * GRAD_BYTES and scattered == steps * GRAD_BYTES
        # Module 0's all-gather runs in its forward pre-hook, under it; waiting for it
        # there is communication time of module 0.
        first = next(n for n in profile.root.walk() if n.path == "0")
        assert first.forward.comm_bytes == steps * (64 * 128 + 128) * 4
        assert first.forward.comm_time_ns and first.forward.comm_time_ns > 0
        assert profile.root.recompute is None
        assert all(node.recompute is None for tree in [profile.root, *profile.parts] for node in tree.walk())
