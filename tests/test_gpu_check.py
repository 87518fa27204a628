"""benchmarks/gpu.py, the one-command GPU check, in its CPU smoke mode (as CI runs it
between GPUs): every part runs or says why it was skipped, and the report is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processes import run_python

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_in_its_cpu_smoke_mode(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    done = run_python([str(ROOT / "benchmarks" / "gpu.py"), "--out", str(tmp_path), "--device", "cpu", "--quick"], ROOT, timeout=600)
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    parts = report["parts"]
    failed = {name: part.get("error") for name, part in parts.items() if part["status"] == "failed"}
    assert done.returncode == 0 and not failed, (failed, done.stderr[-3000:])
    # What needs a GPU says so; everything else ran.
    assert parts["cuda_tests"] == {"status": "skipped", "reason": "the CUDA tests need a GPU", "seconds": parts["cuda_tests"]["seconds"]}
    for name in ("bert_base_forward_float32", "gpt2_adamw_step_float32"):
        part = parts[name]
        assert part["status"] == "ok"
        assert part["block_5_steps"] == {"steps": 5, "problems": []}
        assert part["overhead"]["status"] == "ok" and part["overhead"]["ms_per_step"]["plain"] > 0
        assert part["attribution"]["status"] == "skipped" and part["memory"]["status"] == "skipped"
    assert (tmp_path / "gpt2_adamw_step_float32.html").exists()
    assert parts["ddp_one_device"]["backend"] == "gloo" and parts["ddp_one_device"]["comm_bytes"] > 0
    assert "| cuda_tests | skipped |" in (tmp_path / "report.md").read_text(encoding="utf-8")
