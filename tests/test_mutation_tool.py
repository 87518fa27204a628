"""docs/testing.md's mutation command, in its small form: one module's mutants run
against its tests, every one killed, and the baseline it is compared with held."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_mutation_command_kills_every_mutant_of_stats(tmp_path: Path) -> None:
    pytest.importorskip("mutmut")
    out = tmp_path / "stats.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/mutation.py", "--modules", "base/stats.py", "--workdir", str(tmp_path / "work"),
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    statuses = json.loads(out.read_text())["base/stats.py"]
    assert statuses and all(status in ("killed", "timeout") for status in statuses.values()), statuses
    assert "| base/stats.py | 111 | 111 | 0 | 0 | 0 | 100.0% |" in run.stdout


def test_the_mutation_commands_help_names_its_targets() -> None:
    run = subprocess.run([sys.executable, "benchmarks/mutation.py", "--list"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0
    listed = {line.split(":", 1)[0] for line in run.stdout.splitlines()}
    assert {"flops/formulas.py", "convert/device.py", "attribute/walk.py", "base/stats.py"} <= listed
