"""The static checks run as tests, so CI runs them: mypy on the pure layers, with the
settings of ``[tool.mypy]`` in pyproject.toml (which files, how strict), and ruff on the
code. Both tools are in the ``test`` extra: one that is missing fails here, it is never
skipped.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
PROJECT = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
#: The project's own (git-ignored) cache: a warm run takes about a second, a cold one a few.
MYPY_CACHE = ROOT / ".mypy_cache"


def _tool(module: str) -> list[str]:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed in this environment: it is in the test extra (pip install -e '.[test]')")
    return [sys.executable, "-m", module]


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    # Run from the root: the ``files`` of the config are relative to it.
    return subprocess.run(
        [*_tool("mypy"), "--config-file", str(PYPROJECT), "--cache-dir", str(MYPY_CACHE), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )


def test_mypy_passes_on_the_pure_layers() -> None:
    done = _mypy()
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "no issues found" in done.stdout, done.stdout


def test_mypy_settings_catch_an_untyped_function(tmp_path: Path) -> None:
    # The check above can fail: with these settings an unannotated function and a wrong
    # type are errors.
    bad = tmp_path / "untyped.py"
    bad.write_text('def double(x):\n    return 2 * x\n\n\ncount: int = "three"\n', encoding="utf-8")
    done = _mypy(str(bad))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[no-untyped-def]" in done.stdout and "[assignment]" in done.stdout, done.stdout


def test_mypy_checks_for_the_declared_minimum_python() -> None:
    minimum = PROJECT["project"]["requires-python"].removeprefix(">=")
    assert PROJECT["tool"]["mypy"]["python_version"] == minimum


def test_ruff_passes() -> None:
    done = subprocess.run(
        [*_tool("ruff"), "check", "src", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
