"""Every human-facing table fits a width (issue 33 #8): the CLI's ``--width`` (a
terminal's width by default), ``print()`` of a document (the terminal's, else 120), on
real profiles: zoo models and torch.profiler traces of GPU training steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import layerscope
from conftest import FakeClock
from layerscope import zoo
from layerscope.base import formats
from test_cli import run_cli

WIDTH = 120


def _fits(text: str, width: int = WIDTH) -> None:
    too_wide = [line for line in text.splitlines() if len(line) > width]
    assert not too_wide, too_wide


def _header(text: str) -> list[str]:
    """The table's column headers: the line above the first rule of dashes."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("---"))
    return [cell.strip() for cell in lines[rule - 1].split(" | ")]


@pytest.fixture(scope="module")
def gpt_step() -> layerscope.Profile:
    """zoo:gpt's training step on the CPU, timed by a fake clock."""
    entry = zoo.get("gpt")
    return layerscope.profile(entry.build(), entry.example_inputs(2), backward=True, warmup=1, repeat=2, clock=FakeClock())


@pytest.fixture(scope="module")
def gpu_step(shared_traces: Path) -> layerscope.Profile:
    """GPT-2's AdamW training step on an H100, from torch.profiler's trace."""
    return layerscope.load(shared_traces / "h100_gpt2_adamw_train.json.gz")


@pytest.mark.slow  # runs every table command on real traces: 5 s
def test_every_command_fits_its_width(shared_traces: Path, tmp_path: Path) -> None:
    train = str(shared_traces / "h100_gpt2_adamw_train.json.gz")
    ckpt = str(shared_traces / "h100_gpt2_ckpt_train.json.gz")
    commands = {
        "show": ["show", train],
        "ops": ["show", train, "--format", "ops"],
        "show-ops": ["show", train, "--show-ops", "--depth", "4"],
        "diff": ["diff", train, ckpt, "--limit", "20"],
    }
    for name, args in commands.items():
        whole = run_cli(*args, cwd=tmp_path)  # piped: no limit, as before
        assert whole.returncode == 0, whole
        assert max(len(line) for line in whole.stdout.splitlines()) > WIDTH, f"{name}: the test needs a wider table"
        run = run_cli(*args, "--width", str(WIDTH), cwd=tmp_path)
        assert run.returncode == 0, run
        _fits(run.stdout)
        assert f"Hidden to fit a width of {WIDTH}: " in run.stdout, name
    # The training table keeps a time column of each phase, with the ops nested too.
    assert {"Fwd self", "Bwd self"} <= set(_header(run_cli(*commands["show-ops"], "--width", "120", cwd=tmp_path).stdout))


def test_help_teaches_width(tmp_path: Path) -> None:
    for command in ("show", "diff", "profile"):
        run = run_cli(command, "--help", cwd=tmp_path)
        assert "--width N" in run.stdout and "least important" in run.stdout, command


@pytest.mark.parametrize("fixture", ["gpt_step", "gpu_step"])
def test_print_fits_120_columns_where_stdout_is_no_terminal(fixture: str, request: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(formats, "terminal_width", lambda: None)  # a notebook, a log
    prof = request.getfixturevalue(fixture)
    assert max(len(line) for line in prof.render("text").splitlines()) > WIDTH
    for text in (str(prof), str(prof.ops()), str(layerscope.diff(prof, prof))):
        _fits(text)
    monkeypatch.setattr(formats, "terminal_width", lambda: 100)  # a terminal of 100 columns
    _fits(str(prof), 100)
    assert str(prof) == prof.render("text", width=100)


@pytest.mark.parametrize("fixture", ["gpt_step", "gpu_step"])
def test_a_training_table_never_hides_one_phase(fixture: str, request: Any) -> None:
    prof = request.getfixturevalue(fixture)
    for width in (60, 80, 100, 120, 160):
        for show_ops in (False, True):
            text = prof.render("text", width=width, show_ops=show_ops, depth=4)
            headers = _header(text)
            assert "Fwd self" in headers and "Bwd self" in headers, (width, show_ops, headers)
            if "Fwd total" in headers or "Bwd total" in headers:
                assert "Fwd total" in headers and "Bwd total" in headers
    text = prof.render("text", width=WIDTH, show_ops=True, depth=4)
    _fits(text)


def test_a_merged_run_fits_its_width() -> None:
    from layerscope.model.ranks import merge
    from test_ranks import four_ranks

    run = merge(four_ranks())
    assert max(len(line) for line in run.render("text").splitlines()) > 100
    text = run.render("text", width=100)
    _fits(text, 100)
    assert "Imbalance" in text  # the figure the report is for stays


def test_a_benchmark_fits_its_width() -> None:
    from test_bench import BASE, made

    result = made(BASE | {32: [1_500_000, 1_900_000, 1_200_000, 1_400_000, 1_500_000]})
    assert max(len(line) for line in result.render("text").splitlines()) > 100
    text = result.render("text", width=100)
    _fits(text, 100)
    assert "p50" in text and "samples/s" in text
