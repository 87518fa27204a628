"""Commands that run no model import no torch.

``layerscope zoo``, ``--help``, a usage or SPEC error that can be known without torch,
and ``show``, ``diff`` and ``merge`` of saved documents answer without loading torch
(seconds of a cold start). Each case runs ``layerscope.cli.main(ARGS)`` in a cold
``python -c`` child of its own (the suite's warm interpreter, ``processes.py``, has
torch imported already) and reads which modules the child had imported by its end, so
a new import of torch on one of these paths fails here. Times are not asserted: they
belong to ``benchmarks/commands.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import layerscope
from processes import run_layerscope

#: Runs ``main(argv)`` (argparse's own exits included) and writes its status and the
#: heavy modules it imported to the file named first.
_CHILD = r"""
import json, sys
result, argv = sys.argv[1], sys.argv[2:]
status = None
try:
    from layerscope.cli import main
    status = main(argv)
except SystemExit as exc:
    status = exc.code
finally:
    heavy = ("torch", "transformers", "sympy")
    seen = sorted(m for m in sys.modules if m.split(".")[0] in heavy)
    with open(result, "w") as out:
        json.dump({"status": status, "imported": seen}, out)
"""


def _cold(args: list[str], cwd: Path) -> tuple[int, list[str]]:
    """``main(args)``'s exit status in a fresh interpreter, and the torch,
    transformers and sympy modules that interpreter imported."""
    env = dict(os.environ)
    package_root = str(Path(layerscope.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    result = cwd / "result.json"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(result), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert result.exists(), done.stderr
    found = json.loads(result.read_text())
    result.unlink()
    return found["status"], found["imported"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a saved profile (``x.json``) and two rank files of one run made from it."""
    folder = tmp_path_factory.mktemp("no-torch")
    made = run_layerscope(["profile", "zoo:mlp", "--warmup", "0", "--repeat", "1", "-o", "x.json"], folder)
    assert made.returncode == 0, made.stderr
    document = json.loads((folder / "x.json").read_text())
    for rank in (0, 1):
        document["meta"].update(rank=rank, world_size=2, run_id="no-torch")
        (folder / f"rank{rank}.json").write_text(json.dumps(document))
    return folder


@pytest.mark.parametrize(
    ("args", "status"),
    [
        pytest.param(["--help"], 0, id="help"),
        pytest.param(["profile", "--help"], 0, id="profile-help"),
        pytest.param(["--version"], 0, id="version"),
        pytest.param([], 2, id="no-command"),
        pytest.param(["zoo"], 0, id="zoo"),
        pytest.param(["profile", "zoo:nope"], 2, id="unknown-zoo-name"),
        pytest.param(["flops", "zoo:nope"], 2, id="flops-unknown-zoo-name"),
        pytest.param(["bench", "zoo:nope"], 2, id="bench-unknown-zoo-name"),
        pytest.param(["profile", "nosuch.module:Model"], 2, id="module-not-there"),
        pytest.param(["profile", "nofile.py:build"], 2, id="file-not-there"),
        pytest.param(["profile", "no-colon"], 2, id="malformed-spec"),
        pytest.param(["profile", "zoo:mlp", "--inputs", "nosuch:make"], 2, id="inputs-module-not-there"),
        pytest.param(["profile", "zoo:mlp", "--config", "hidden_size=8"], 2, id="config-for-a-zoo-model"),
        pytest.param(["profile", "zoo:mlp", "--format", "nope"], 2, id="unknown-format"),
        pytest.param(["profile", "zoo:mlp", "--format", "json", "--depth", "2"], 2, id="option-not-for-format"),
        pytest.param(["profile", "zoo:mlp", "--input", "8xx3"], 2, id="bad-shape"),
        pytest.param(["profile", "zoo:mlp", "--input", "8x3", "--dtype", "float8"], 2, id="bad-dtype"),
        pytest.param(["profile", "zoo:mlp", "--peak-tflops", "-1"], 2, id="bad-peak"),
        pytest.param(["show", "x.json"], 0, id="show"),
        pytest.param(["show", "x.json", "--format", "ops"], 0, id="show-ops"),
        pytest.param(["show", "x.json", "--peak-tflops", "100"], 0, id="show-peak"),
        pytest.param(["show", "x.json", "--format", "chrome", "-o", "x.trace.json"], 0, id="show-chrome"),
        pytest.param(["show", "missing.json"], 2, id="show-missing-file"),
        pytest.param(["show", "missing.json.gz", "--no-shapes"], 2, id="show-missing-file-no-shapes"),
        pytest.param(["diff", "x.json", "x.json"], 0, id="diff"),
        pytest.param(["diff", "x.json", "x.json", "--format", "json"], 0, id="diff-json"),
        pytest.param(["merge", "rank0.json", "rank1.json"], 0, id="merge"),
    ],
)
def test_a_command_that_runs_no_model_imports_no_torch(args: list[str], status: int, saved: Path) -> None:
    assert _cold(args, saved) == (status, [])


def test_the_check_sees_a_command_that_imports_torch(saved: Path) -> None:
    """The check itself: a command that runs a model is seen importing torch."""
    status, imported = _cold(["flops", "zoo:mlp", "--no-memory"], saved)
    assert status == 0 and "torch" in imported


def test_import_layerscope_and_its_documents_need_no_torch(tmp_path: Path) -> None:
    """The package, ``load``, ``diff``, ``merge`` and the zoo's listing leave torch
    unloaded; a name that profiles (``layerscope.profile``) loads it when asked for."""
    code = r"""
import json, sys
import layerscope
from layerscope import zoo
names = zoo.names() and [zoo.get(n).description for n in zoo.names()]
api = (layerscope.load, layerscope.diff, layerscope.merge, layerscope.Profile, layerscope.check_tree)
before = "torch" in sys.modules
layerscope.profile
print(json.dumps([before, "torch" in sys.modules]))
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(layerscope.__file__).resolve().parents[1]), env.get("PYTHONPATH")])
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, True]


def _trace(folder: Path, *, record_shapes: bool) -> str:
    """A torch.profiler trace of a small model's forward, with or without shapes."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.profiler.profile(record_shapes=record_shapes, with_stack=True) as prof:
        model(torch.randn(2, 8))
    name = f"shapes-{record_shapes}.json"
    prof.export_chrome_trace(str(folder / name))
    return name


@pytest.mark.slow  # records two traces, then two cold command lines
def test_show_of_a_trace_without_shapes_imports_no_torch_and_with_shapes_counts_flops(tmp_path: Path) -> None:
    """A trace without recorded shapes has no FLOPs to count: it is read without torch.
    With shapes, torch's op schemas and FLOP formulas are imported, and FLOPs shown."""
    assert _cold(["show", _trace(tmp_path, record_shapes=False)], tmp_path) == (0, [])
    status, imported = _cold(["show", _trace(tmp_path, record_shapes=True)], tmp_path)
    assert status == 0 and "torch" in imported


@pytest.mark.slow  # a cold command line per format
@pytest.mark.parametrize("fmt", ["text", "ops", "json", "folded", "chrome", "html"])
def test_show_of_a_trace_with_shapes_read_without_them_imports_no_torch(tmp_path: Path, fmt: str) -> None:
    """``--no-shapes`` reads a trace with recorded shapes as one without: no FLOP
    counting, so no torch, in every format; the output says FLOPs are unknown and why."""
    name = _trace(tmp_path, record_shapes=True)
    assert _cold(["show", name, "--no-shapes", "--format", fmt, "-o", f"out.{fmt}"], tmp_path) == (0, [])
    if fmt == "text":
        assert "FLOPs unknown: the trace was read without its recorded shapes" in (tmp_path / "out.text").read_text()


def test_diff_and_merge_of_traces_read_without_shapes_import_no_torch(tmp_path: Path, shared_traces: Path) -> None:
    name = _trace(tmp_path, record_shapes=True)
    assert _cold(["diff", name, name, "--no-shapes"], tmp_path) == (0, [])
    rank = str(shared_traces / "mi300x_resnet_ddp_actckpt_train_rank0.json.gz")
    assert _cold(["merge", rank, "--no-shapes", "-o", "merged.json"], tmp_path) == (0, [])


def test_no_shapes_is_refused_for_a_saved_profile(saved: Path) -> None:
    done = run_layerscope(["show", "x.json", "--no-shapes"], saved)
    assert done.returncode == 2
    assert "--no-shapes reads a torch.profiler trace file without its recorded shapes; x.json is a saved document" in done.stderr
