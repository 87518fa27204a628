"""The Python versions layerscope declares are the ones it runs on, checked by tools.

``requires-python`` is the oldest Python the suite runs on (CI runs that one: 3.11, the
first with ``BaseException.add_note``, which the command line uses). ruff parses for the
same ``target-version``, and vermin fails on any syntax or standard-library API newer
than it, so code for a later Python cannot slip in.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _minimum() -> tuple[int, int]:
    spec = PROJECT["project"]["requires-python"]
    assert spec.startswith(">="), spec
    major, minor = spec[2:].split(".")[:2]
    return int(major), int(minor)


def test_the_declared_minimum_is_what_runs_here_or_older() -> None:
    assert sys.version_info[:2] >= _minimum()
    # The suite is run on the declared minimum in CI: a claim below what runs is untested.
    if sys.version_info[:2] != _minimum():
        from conftest import in_ci

        # CI runs the declared minimum: a claim below what runs there is untested.
        (pytest.fail if in_ci() else pytest.skip)(
            f"the declared minimum is {_minimum()}; this is {sys.version_info[:2]} (CI runs the minimum)"
        )


def test_ruff_parses_for_the_declared_minimum() -> None:
    major, minor = _minimum()
    assert PROJECT["tool"]["ruff"]["target-version"] == f"py{major}{minor}"


def test_nothing_needs_a_newer_python_than_declared() -> None:
    major, minor = _minimum()
    done = subprocess.run(
        [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())", "--no-tips", "--eval-annotations", "--violations", f"-t={major}.{minor}-",
         "src/layerscope", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
