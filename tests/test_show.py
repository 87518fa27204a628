"""``layerscope show``: a saved profile re-rendered in every format, without the model;
and bad files refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import layerscope
from layerscope.render import formats, get_renderer
from test_cli import assert_usage_error, run_cli


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("show")
    run = run_cli("profile", "zoo:lenet5", "--backward", "--repeat", "1", "-o", "lenet5.json", cwd=folder)
    assert run.returncode == 0, run.stderr
    return folder / "lenet5.json"


@pytest.mark.parametrize("fmt", formats())
def test_show_renders_every_format_as_the_library_does(saved: Path, fmt: str) -> None:
    if get_renderer(fmt).binary:  # a picture goes to a file only
        run = run_cli("show", saved.name, "--format", fmt, "-o", "picture.bin", cwd=saved.parent)
        assert run.returncode == 0, run.stderr
        assert (saved.parent / "picture.bin").read_bytes() == layerscope.load(str(saved)).render(fmt)
        return
    if fmt == "kernels":  # a compiled model's (test_compiled shows one); this one ran eagerly
        line = assert_usage_error(run_cli("show", saved.name, "--format", fmt, cwd=saved.parent))
        assert "the kernels format is for a torch.compile'd model's profile" in line
        return
    first = run_cli("show", saved.name, "--format", fmt, cwd=saved.parent)
    assert first.returncode == 0, first.stderr
    again = run_cli("show", saved.name, "--format", fmt, cwd=saved.parent)
    assert again.stdout == first.stdout  # deterministic
    assert first.stdout == layerscope.load(str(saved)).render(fmt)


def test_show_json_is_the_saved_document(saved: Path) -> None:
    run = run_cli("show", saved.name, "--format", "json", cwd=saved.parent)
    assert json.loads(run.stdout) == json.loads(saved.read_text(encoding="utf-8"))


def test_show_writes_the_format_its_output_name_says(saved: Path) -> None:
    run = run_cli("show", saved.name, "-o", "lenet5.trace.json", cwd=saved.parent)
    assert run.returncode == 0, run.stderr
    assert "wrote chrome to lenet5.trace.json" in run.stderr
    doc = json.loads((saved.parent / "lenet5.trace.json").read_text(encoding="utf-8"))
    assert any(e["ph"] == "X" and e["cat"].startswith("op,") for e in doc["traceEvents"])
    leftovers = [p.name for p in saved.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_show_passes_table_options(saved: Path) -> None:
    run = run_cli("show", saved.name, "--format", "ops", "--group-by", "shape", "--limit", "2", cwd=saved.parent)
    assert run.returncode == 0, run.stderr
    assert "Showing 2 of" in run.stdout
    line = assert_usage_error(run_cli("show", saved.name, "--sort-by", "flops", cwd=saved.parent))
    assert "only for --format ops" in line


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"schema": "layerscope/1", "meta": {}, "mod', "not valid JSON"),
        ('{"traceEvents": []}', "not a layerscope profile"),
        ('{"schema": "layerscope/9", "modules": []}', "layerscope/9"),
        ("\x00\x01binary", "not"),
    ],
    ids=["truncated", "other-tool", "unknown-schema", "binary"],
)
def test_show_refuses_bad_files_in_one_line(tmp_path: Path, content: str, says: str) -> None:
    (tmp_path / "bad.json").write_text(content, encoding="utf-8")
    line = assert_usage_error(run_cli("show", "bad.json", cwd=tmp_path))
    assert "bad.json" in line and says in line


def test_show_missing_file_and_unwritable_output(saved: Path, tmp_path: Path) -> None:
    assert "no such profile file" in assert_usage_error(run_cli("show", "missing.json", cwd=tmp_path))
    line = assert_usage_error(run_cli("show", str(saved), "-o", "no/such/folder/x.csv", cwd=tmp_path))
    assert "does not exist" in line


def test_show_a_profile_without_a_trace_says_why(tmp_path: Path) -> None:
    run = run_cli("profile", "zoo:mlp", "--no-ops", "--repeat", "1", "-o", "plain.json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    line = assert_usage_error(run_cli("show", "plain.json", "--format", "chrome", cwd=tmp_path))
    assert "no trace" in line


def test_the_data_loaders_long_range_name_is_shortened_in_the_tree() -> None:
    from layerscope.model.tree import ModuleNode, PhaseStats, Profile

    stats = PhaseStats(cpu_time_ns=10, self_cpu_time_ns=10)
    root = ModuleNode("", "Net", calls=1, params=0, params_total=0, forward=stats)
    part = ModuleNode("<enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__>", "label", kind="label", calls=1,
                      forward=PhaseStats(cpu_time_ns=5, self_cpu_time_ns=5))
    profile = Profile(root=root, parts=[part], meta={"step_time_ns": 15})
    text = profile.render("text")
    assert "<DataLoader.__next__>" in text and "_SingleProcessDataLoaderIter" not in text
    from layerscope.render.html import report_data

    assert "<DataLoader.__next__>" in [node["name"] for node in report_data(profile)["nodes"]]
    assert profile.node(part.path) is part  # the path stays torch's name: only the display is short


def test_show_ops_keeps_the_input_shapes_when_the_table_must_fit() -> None:
    from layerscope.model.tree import ModuleNode, OpStats, PhaseStats, Profile

    stats = PhaseStats(cpu_time_ns=30, self_cpu_time_ns=30, flops=12, self_flops=12)
    ops = [OpStats("aten::t", calls=1, cpu_time_ns=10, self_cpu_time_ns=10, input_shapes=[[64, 32 * i]], flops=4)
           for i in (1, 2, 3)]
    profile = Profile(root=ModuleNode("", "Net", calls=1, params=0, params_total=0, forward=stats, ops=ops))
    text = profile.render("text", show_ops=True, width=60)
    # The three aten::t rows differ by their shapes alone: those stay, other columns go.
    assert "Input shapes" in text
    assert all(f"[[64, {32 * i}]]" in text for i in (1, 2, 3))
    assert "Hidden to fit a width of 60" in text


def test_one_columns_list_works_on_a_forward_pass_and_a_training_step(tmp_path: Path) -> None:
    """README's ``--columns self_cpu,cpu_total,flops,params``: on a training step each
    name shows every phase's figure; the step table's names work on a forward pass."""
    from conftest import FakeClock
    from layerscope import zoo
    from layerscope.base.errors import RenderError

    entry = zoo.get("mlp")
    forward = layerscope.profile(entry.build(), entry.example_inputs(2), warmup=0, repeat=1, clock=FakeClock())
    step = layerscope.profile(entry.build(), entry.example_inputs(2), warmup=0, repeat=1, clock=FakeClock(), backward=True)

    def headers(profile: layerscope.Profile, columns: list[str]) -> list[str]:
        lines = profile.render("text", columns=columns).splitlines()
        return [cell.strip() for cell in lines[lines.index("") + 1].split(" | ")]

    readme = ["self_cpu", "cpu_total", "flops", "params"]
    assert headers(forward, readme) == ["Module", "Self CPU", "CPU total", "FLOPs", "Params"]
    assert headers(step, readme) == ["Module", "Fwd self", "Bwd self", "Fwd total", "Bwd total", "Fwd FLOPs", "Bwd FLOPs", "Params"]
    assert headers(forward, ["fwd_self", "fwd_flops"]) == ["Module", "Self CPU", "FLOPs"]
    assert headers(step, ["fwd_self", "bwd_self"]) == ["Module", "Fwd self", "Bwd self"]
    with pytest.raises(RenderError, match=r"no column 'bwd_self' \(not in the table of a forward-only profile: it has no backward\); it has: type, self_cpu"):
        forward.render("text", columns=["bwd_self"])
    with pytest.raises(RenderError, match=r"no column 'macs' \(not in the table of a training-step profile\); it has: type, fwd_self"):
        step.render("text", columns=["macs"])
    # On the command line, a name neither table has is refused with the names it could be.
    saved = tmp_path / "step.json"
    step.save(saved)
    run = run_cli("show", str(saved), "--columns", "self_cpu,slef_cpu", cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == "", run
    error = run.stderr
    assert "unknown column 'slef_cpu'; expected some of: type, self_cpu, cpu_total" in error and "fwd_self" in error
    run = run_cli("show", str(saved), "--columns", "self_cpu,flops", cwd=tmp_path)
    assert run.returncode == 0, run
    assert "Fwd self" in run.stdout and "Bwd FLOPs" in run.stdout
