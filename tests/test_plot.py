"""``layerscope.render.plot.plot_memory`` and ``layerscope plot-memory``: the memory timeline as a PNG.

Profiles are real: a zoo MLP training step with Adam under ``Profiler``, and a tiny BERT
profiled with ``backward=True``. The PNG is checked by its signature and IHDR size.
"""

from __future__ import annotations

import copy
import os
import struct
import sys
import warnings
from pathlib import Path

import pytest
import torch

import layerscope
import layerscope.zoo
from layerscope import cli
from layerscope.base.errors import MissingDependencyError
from layerscope.model.sidedocs import Timeline
from layerscope.render.plot import (
    DPI,
    FIGSIZE,
    _breakdown,
    _byte_unit,
    _lanes,
    plot_memory,
    render_bench_png,
    render_memory_png,
)
from processes import run_layerscope
from test_cli import assert_usage_error, run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXPECTED_SIZE = (round(FIGSIZE[0] * DPI), round(FIGSIZE[1] * DPI))


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    assert data[:8] == PNG_SIGNATURE, data[:16]
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    return width, height


# -- real profiles ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plot")


@pytest.fixture(scope="module")
def mlp_step(folder: Path) -> Path:
    """A zoo MLP training step (zero_grad, forward, loss, backward, Adam step), saved."""
    torch.manual_seed(0)
    entry = layerscope.zoo.get("mlp")
    model, x = entry.build(), entry.example_inputs(4)
    opt = torch.optim.Adam(model.parameters())
    with layerscope.Profiler(model) as prof:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    path = folder / "mlp_step.json"
    prof.profile.save(path)
    return path


@pytest.fixture(scope="module")
def bert_profile() -> layerscope.Profile:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=500
    )
    model = transformers.BertModel(config)
    ids = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(0))
    return layerscope.profile(model, {"input_ids": ids}, backward=True, warmup=1, repeat=1)


@pytest.fixture(scope="module")
def no_memory(folder: Path) -> Path:
    entry = layerscope.zoo.get("mlp")
    prof = layerscope.profile(entry.build(), entry.example_inputs(2), memory=False, warmup=0, repeat=1)
    assert prof.memory is None
    path = folder / "no_memory.json"
    prof.save(path)
    return path


def test_the_profiles_have_a_timeline(mlp_step: Path, bert_profile: layerscope.Profile) -> None:
    for profile in (layerscope.load(mlp_step), bert_profile):
        timeline = profile.memory.timeline
        assert len(timeline.t_ns) == len(timeline.bytes) > 1
        assert max(timeline.bytes) == profile.memory.peak_bytes
        assert any(span.path == "" for span in timeline.spans)


# -- the CLI ----------------------------------------------------------------------------------


def test_cli_writes_a_png_of_the_figure_size(
    mlp_step: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "memory.png"
    assert cli.main(["plot-memory", str(mlp_step), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [f"layerscope: wrote the memory timeline to {out}"]
    assert png_size(out.read_bytes()) == EXPECTED_SIZE
    # Atomic: the temporary file was renamed over OUT; nothing else is left in the folder.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png"]


def test_cli_title_and_overwrite(mlp_step: Path, tmp_path: Path) -> None:
    out = tmp_path / "memory.png"
    out.write_bytes(b"an old picture")
    assert cli.main(["plot-memory", str(mlp_step), "-o", str(out), "--title", "Adam $step$ <1>"]) == 0
    assert png_size(out.read_bytes()) == EXPECTED_SIZE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png"]


def test_rendering_twice_gives_the_same_size(bert_profile: layerscope.Profile, tmp_path: Path) -> None:
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    plot_memory(bert_profile, first)
    plot_memory(bert_profile, second, title="again")
    assert png_size(first.read_bytes()) == png_size(second.read_bytes()) == EXPECTED_SIZE
    # A saved-and-loaded profile draws the same way as the one in memory.
    saved = tmp_path / "bert.json"
    bert_profile.save(saved)
    third = tmp_path / "c.png"
    plot_memory(layerscope.load(saved), third)
    assert png_size(third.read_bytes()) == EXPECTED_SIZE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png", "bert.json", "c.png"]


def test_any_extension_from_python_but_the_cli_wants_png(
    mlp_step: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "memory.img"
    plot_memory(layerscope.load(mlp_step), out)
    assert png_size(out.read_bytes()) == EXPECTED_SIZE
    assert cli.main(["plot-memory", str(mlp_step), "-o", str(tmp_path / "memory.svg")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"layerscope: error: plot-memory writes a PNG: give -o a name ending in .png, got {str(tmp_path / 'memory.svg')!r}"
    ]
    assert not (tmp_path / "memory.svg").exists()


def test_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["plot-memory", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text
    assert "layerscope plot-memory gpt.json -o gpt_memory.png" in text
    assert "-o OUT.png" in text and "--title" in text
    assert "pip install 'layerscope[plot]'" in text
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert "plot-memory" in capsys.readouterr().out


def test_output_is_required(mlp_step: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["plot-memory", str(mlp_step)])
    assert exit_info.value.code == 2
    assert "-o/--output" in capsys.readouterr().err


# -- errors -------------------------------------------------------------------------------------


def test_no_memory_is_a_helpful_value_error(no_memory: Path, tmp_path: Path) -> None:
    profile = layerscope.load(no_memory)
    with pytest.raises(ValueError, match="no memory timeline") as info:
        plot_memory(profile, tmp_path / "x.png")
    message = str(info.value)
    assert "memory=False" in message and "record_ops=False" in message
    assert "layerscope.Profiler(model)" in message  # how to get one
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_empty_timeline_is_a_value_error(mlp_step: Path, tmp_path: Path) -> None:
    profile = layerscope.load(mlp_step)
    profile.memory = copy.deepcopy(profile.memory)
    profile.memory.timeline = Timeline()
    with pytest.raises(ValueError, match="no memory timeline"):
        plot_memory(profile, tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []


def test_a_one_point_timeline_without_spans_still_draws(mlp_step: Path, tmp_path: Path) -> None:
    profile = layerscope.load(mlp_step)
    profile.memory = copy.deepcopy(profile.memory)
    profile.memory.timeline = Timeline(t_ns=[0], bytes=[0], points_recorded=1)
    profile.memory.peak_bytes, profile.memory.baseline_bytes, profile.memory.peak_at = 0, 0, None
    profile.memory.peak_categories = {}
    out = tmp_path / "x.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no singular-limits warnings from matplotlib
        plot_memory(profile, out)
    assert png_size(out.read_bytes()) == EXPECTED_SIZE


def test_cli_on_a_profile_without_memory(no_memory: Path, tmp_path: Path) -> None:
    run = run_cli("plot-memory", str(no_memory), "-o", "out.png", cwd=tmp_path)
    line = assert_usage_error(run)
    assert line.startswith(f"layerscope: error: {no_memory}: this profile has no memory timeline")
    assert "memory=False" in line
    assert list(tmp_path.iterdir()) == []


def test_cli_on_a_missing_file(tmp_path: Path) -> None:
    run = run_cli("plot-memory", "nowhere.json", "-o", "out.png", cwd=tmp_path)
    assert assert_usage_error(run) == "layerscope: error: no such profile file: 'nowhere.json'"
    assert list(tmp_path.iterdir()) == []


def test_cli_on_a_file_that_is_not_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.json").write_text('{"hello": 1}', encoding="utf-8")
    assert cli.main(["plot-memory", str(tmp_path / "notes.json"), "-o", str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"layerscope: error: {str(tmp_path / 'notes.json')!r} is not a layerscope profile (no 'schema' field)"]
    assert not (tmp_path / "out.png").exists()


def test_cli_into_a_missing_folder(mlp_step: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "no" / "such" / "memory.png"
    assert cli.main(["plot-memory", str(mlp_step), "-o", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"layerscope: error: cannot write {str(out)!r}: folder ")
    assert "does not exist" in line


def test_without_matplotlib(
    mlp_step: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import matplotlib.figure  # noqa: F401  (cached submodules must not slip past)

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "memory.png"
    install = "pip install 'layerscope[plot]' (or pip install matplotlib)"
    with pytest.raises(MissingDependencyError) as info:
        plot_memory(layerscope.load(mlp_step), out)
    assert isinstance(info.value, ImportError)
    assert str(info.value) == f"drawing a memory timeline needs matplotlib: {install}"
    with pytest.raises(MissingDependencyError, match=r"^drawing a benchmark needs matplotlib: "):
        render_bench_png({})
    # The CLI names the command the user ran, with the option that asked for a picture.
    for argv, asked in [
        (["plot-memory", str(mlp_step), "-o", str(out)], "plot-memory"),
        (["show", str(mlp_step), "--format", "png", "-o", str(out)], "show --format png"),
        (["show", str(mlp_step), "--format", "png"], "show --format png"),
        (["show", str(mlp_step), "-o", str(out)], f"show -o {out}"),
    ]:
        assert cli.main(argv) == 2
        assert capsys.readouterr().err.splitlines() == [f"layerscope: error: {asked} needs matplotlib: {install}"]
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_old_file(
    mlp_step: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "memory.png"
    out.write_bytes(b"the old picture")

    def refuse(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    assert cli.main(["plot-memory", str(mlp_step), "-o", str(out)]) == 4
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"layerscope: error: cannot write {str(out)!r}: No space left on device"
    assert out.read_bytes() == b"the old picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png"]  # no temporary file left


# -- helpers ------------------------------------------------------------------------------------


def test_byte_units_follow_the_magnitude() -> None:
    assert _byte_unit(900) == ("B", 1.0)
    assert _byte_unit(900 * 1024) == ("KiB", 1024.0)
    assert _byte_unit(5 * 1024**2) == ("MiB", 1024.0**2)
    assert _byte_unit(3 * 1024**3) == ("GiB", 1024.0**3)


def test_overlapping_spans_get_their_own_lanes() -> None:
    spans = [(0, 10, "a", "forward"), (10, 20, "b", "forward"), (5, 15, "c", "backward"), (16, 30, "d", "backward")]
    assert _lanes(spans) == [0, 0, 1, 1]


def test_breakdown_names_every_category(mlp_step: Path) -> None:
    memory = layerscope.load(mlp_step).memory
    text = _breakdown(memory, memory.peak_bytes, memory.baseline_bytes)
    for name in ("parameters", "gradients", "optimizer state", "activations", "other"):
        assert name in text
    assert text.startswith(f"At the peak, {layerscope.base.fmt.nbytes(memory.peak_bytes)}")
    # The Adam step holds the peak: its state is counted.
    assert memory.peak_categories["optimizer_state"] > 0


def test_debug_adds_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nowhere.json")
    assert cli.main(["plot-memory", missing, "-o", str(tmp_path / "out.png"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1] == f"layerscope: error: no such profile file: {missing!r}"


def test_png_is_a_registered_binary_format(tmp_path: Path) -> None:
    """``-o x.png`` draws the memory timeline of a profile and a benchmark's curves, through
    the registry; on stdout a picture is refused with what to do instead."""
    pytest.importorskip("matplotlib")
    from layerscope.render import format_for_path, get_renderer

    assert format_for_path("m.png") == "png" and format_for_path("b.png", document="bench") == "png"
    assert get_renderer("png").binary and get_renderer("png", "bench").binary
    entry = layerscope.zoo.get("mlp")
    prof = layerscope.profile(entry.build(), entry.example_inputs(2), backward=True, repeat=1, warmup=1)
    prof.save(str(tmp_path / "m.png"))
    picture = (tmp_path / "m.png").read_bytes()
    assert picture[:8] == b"\x89PNG\r\n\x1a\n" and picture == prof.render("png")
    assert picture == render_memory_png(prof)  # the drawing plot-memory writes
    json_path = tmp_path / "step.json"
    prof.save(str(json_path))
    done = run_layerscope(["show", str(json_path), "--format", "png"], tmp_path)
    assert done.returncode == 2 and "-o NAME.png" in done.stderr and done.stdout == ""
