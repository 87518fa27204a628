"""The README's exit statuses, command by command: bad input is exit 2 naming what was
wrong (the file, the event and the field of a damaged trace; the --input shape a model
refused; an --autocast dtype the device does not run), the model's own error exit 1,
every error one line, Ctrl-C one line and exit 130 at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layerscope.cli import main


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    status = main(list(args))
    return status, capsys.readouterr().err.splitlines()


def test_a_trace_with_a_time_that_is_no_number_is_damaged_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad_ts.json"
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1, "dur": 2, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": "abc", "dur": 7900, "pid": 1, "tid": 1},
    ]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    assert _run(capsys, "show", str(path)) == (2, [
        f"layerscope: error: {str(path)!r} is a damaged torch.profiler trace: event 1 ('aten::mm', cpu_op): "
        "'ts' is 'abc', not a number of microseconds"
    ])


def test_a_model_that_raises_is_one_line_naming_the_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "raising.py").write_text(
        "from torch import nn\n"
        "class Inner(nn.Module):\n"
        "    def forward(self, x):\n"
        "        raise ValueError('bad thing happened\\nsecond line')\n"
        "def build():\n"
        "    return nn.Sequential(nn.Linear(4, 4), Inner())\n"
    )
    assert _run(capsys, "flops", f"{tmp_path / 'raising.py'}:build", "--input", "2x4") == (1, [
        "layerscope: error: the model raised ValueError in module '1' (Inner): bad thing happened ... "
        "[--debug: the traceback]"
    ])


@pytest.mark.parametrize(("spec", "shape", "said"), [
    ("zoo:mlp", "2x5", "RuntimeError in module 'layers.0' (Linear): mat1 and mat2 shapes cannot be multiplied "
     "(2x5 and 64x256)"),
    ("zoo:lenet5", "1x3x32x32", "RuntimeError in module 'features.0' (Conv2d): Given groups=1, weight of size [6, 1, 5, 5], "
     "expected input[1, 3, 32, 32] to have 1 channels, but got 3 channels instead"),
])
def test_an_input_shape_the_model_refuses_is_bad_input(
    spec: str, shape: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "flops", spec, "--input", shape) == (2, [
        f"layerscope: error: --input {shape} does not fit the model: {said}"
    ])


def test_an_autocast_dtype_the_device_does_not_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "profile", "zoo:mlp", "--autocast", "float32") == (2, [
        "layerscope: error: --autocast float32: autocast on cpu runs bfloat16 or float16; expected one of those"
    ])


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """SIGINT while the model runs: one line, exit 130, no torch warning (the run is
    abandoned, not unwound through torch's profiler)."""
    started = tmp_path / "started"
    (tmp_path / "slow.py").write_text(
        "import pathlib, time, torch\n"
        "class Slow(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        f"        pathlib.Path({str(started)!r}).touch()\n"
        "        time.sleep(0.05)\n"
        "        return self.linear(x)\n"
        "def build():\n"
        "    return Slow()\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "layerscope", "profile", f"{tmp_path / 'slow.py'}:build", "--input", "2x8",
         "--repeat", "10000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        for _ in range(600):
            if started.exists() or run.poll() is not None:
                break
            time.sleep(0.05)
        assert started.exists(), "the model never ran"
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert (run.returncode, err) == (130, "layerscope: interrupted\n")


def test_a_model_given_for_a_saved_document_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--model`` maps a trace's modules; a saved profile knows its own, so it is refused,
    never silently ignored (as ``--no-shapes`` is refused for one)."""
    import torch

    import layerscope

    path = tmp_path / "saved.json"
    layerscope.count_flops(torch.nn.Linear(2, 2), torch.randn(1, 2)).save(path)
    assert _run(capsys, "show", str(path), "--model", "zoo:mlp") == (2, [
        f"layerscope: error: --model names the model a torch.profiler trace was recorded with; {path} is not a "
        "trace (a saved document knows its modules): drop --model"
    ])


def test_the_trees_options_beside_o_print_the_tree_and_save_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--depth 0 -o run.json``: one run, the file written in its format and the tree
    printed with the tree's options; an option of neither (``--sort-by``, the op
    table's) is still refused."""
    import layerscope

    out = tmp_path / "run.json"
    assert main(["flops", "zoo:mlp", "--depth", "0", "-o", str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.err.strip() == f"layerscope: wrote json to {out}"
    saved = layerscope.load(out)
    assert printed.out.rstrip("\n") == saved.render("text", depth=0).rstrip("\n")
    assert "└──" not in printed.out  # depth 0: the root's row alone
    assert _run(capsys, "flops", "zoo:mlp", "--sort-by", "flops", "-o", str(out)) == (2, [
        "layerscope: error: --sort-by: only for --format ops (the format here is json)"
    ])
