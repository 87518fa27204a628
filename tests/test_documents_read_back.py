"""Every document layerscope writes, it reads back: each kind of profile (each entry
point, and the options that change what a document holds), traces read with and
without shapes and aligned to their model, and merged ranks, saved, loaded, saved again
byte for byte, and rendered in every format of their kind, each format either rendered
or refused with one line that says why (never a crash, never a schema error)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope import zoo
from layerscope.base.errors import LayerscopeError, LayerscopeWarning
from layerscope.base.formats import formats

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
STRAGGLER = Path(__file__).parent / "data" / "ddp_straggler"


def _mlp() -> tuple[nn.Module, Any]:
    entry = zoo.get("mlp")
    torch.manual_seed(0)
    return entry.build(), entry.example_inputs(2)


def _block(steps: int = 3, compiled: bool = False, **options: Any) -> Callable[[Path], Any]:
    def make(_: Path) -> Any:
        eager, x = _mlp()
        model = torch.compile(eager) if compiled else eager
        opt = torch.optim.SGD(eager.parameters(), lr=0.0)
        with layerscope.Profiler(model, **options) as prof:
            for _ in range(steps):
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                prof.step()
        return prof.profile

    return make


def _trace_without_stack(folder: Path) -> Any:
    from torch.profiler import profile

    model, x = _mlp()
    with profile(record_shapes=True) as prof:
        model(x).sum().backward()
    prof.export_chrome_trace(str(folder / "no_stack.json"))
    return layerscope.load(folder / "no_stack.json", model=model, inputs=x)


def _shared(name: str, **options: Any) -> Callable[[Path], Any]:
    def make(_: Path) -> Any:
        if not SHARED_TRACES.is_dir():
            pytest.skip(f"the real GPU traces are not here (expected in {SHARED_TRACES})")
        return layerscope.load(SHARED_TRACES / f"{name}.json.gz", **options)

    return make


def _merged(_: Path) -> Any:
    return layerscope.merge([layerscope.load(path) for path in sorted(STRAGGLER.glob("*.json"))])


def _bench(_: Path) -> Any:
    model, x = _mlp()
    return layerscope.benchmark(model, x[:1], batch_sizes=(1, 2), warmup=0, min_runs=2, min_time_s=0.0)


def _diff(_: Path) -> Any:
    model, x = _mlp()
    return layerscope.diff(layerscope.count_flops(model, x), layerscope.count_flops(model, x[:1]))


MAKERS: dict[str, Callable[[Path], Any]] = {
    "profile": lambda _: layerscope.profile(*_mlp(), warmup=0, repeat=2),
    "profile, record_ops=False": lambda _: layerscope.profile(*_mlp(), warmup=0, repeat=1, record_ops=False),
    "profile, memory=False": lambda _: layerscope.profile(*_mlp(), warmup=0, repeat=1, memory=False),
    "profile, backward=True": lambda _: layerscope.profile(*_mlp(), warmup=0, repeat=1, backward=True),
    "count_flops, backward=True": lambda _: layerscope.count_flops(*_mlp(), backward=True),
    "block, every step detailed": _block(),
    "block, detail='first' (aligned light steps)": _block(detail="first", hooks="first"),
    "block, detail='first' (hooked light steps)": _block(detail="first"),
    "block, record_ops=False": _block(record_ops=False),
    "trace with shapes": _shared("h100_bert_small_inference"),
    "trace read without shapes": _shared("h100_bert_small_inference", shapes=False),
    "trace without shapes or modules": _shared("a100_alexnet_no_modules"),
    "trace without stacks, aligned to its model": _trace_without_stack,
    "merged ranks": _merged,
    "compiled profile": lambda _: layerscope.profile(torch.compile(_mlp()[0], backend="eager"), _mlp()[1],
                                                     warmup=1, repeat=1),
    "compiled block": _block(steps=2, compiled=True),
    "compiled trace": _shared("h100_compiled_gpt2_train"),
    "diff": _diff,
    "bench": _bench,
}


#: The kinds whose making takes a second or more here (a block's steps, a real trace):
#: in the slow tier.
SLOW_KINDS = {
    "block, every step detailed", "block, detail='first' (hooked light steps)", "block, record_ops=False",
    "trace with shapes", "trace without shapes or modules", "merged ranks", "compiled profile", "compiled block",
    "compiled trace",
}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k in SLOW_KINDS else k for k in MAKERS])
def test_every_document_reads_back_and_renders_in_every_format(kind: str, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayerscopeWarning)
        document = MAKERS[kind](tmp_path)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    document.save(first)
    loaded = layerscope.load(first)
    loaded.save(second)
    assert first.read_bytes() == second.read_bytes(), kind
    assert loaded.render("text") == document.render("text")
    refused = []
    for fmt in formats(type(document).DOCUMENT):
        try:
            out = loaded.render(fmt)
        except (LayerscopeError, ValueError) as exc:
            message = str(exc)
            assert message and "\n" not in message.strip(), (kind, fmt, message)
            refused.append(fmt)
            continue
        assert out, (kind, fmt)
        if fmt == "json":
            assert json.loads(out)["schema"]
    # The text, JSON and HTML views are never refused.
    assert not {"text", "json", "html"} & set(refused), (kind, refused)


def test_a_saved_diff_is_shown_as_the_diff_command_printed_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``layerscope diff A B -o d.json`` keeps the two profiles, so ``layerscope show
    d.json`` rebuilds the same diff; what only a profile has (``--rank``) is refused."""
    from layerscope.cli import main

    model, x = _mlp()
    layerscope.count_flops(model, x).save(tmp_path / "a.json")
    layerscope.count_flops(model, x[:1]).save(tmp_path / "b.json")
    a, b, saved = str(tmp_path / "a.json"), str(tmp_path / "b.json"), str(tmp_path / "d.json")
    assert main(["diff", a, b]) == 0
    printed = capsys.readouterr().out
    assert main(["diff", a, b, "-o", saved]) == 0
    capsys.readouterr()
    assert main(["show", saved]) == 0
    assert capsys.readouterr().out == printed
    assert main(["show", saved, "--rank", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"--rank and --peak-tflops: {saved} is a saved diff; layerscope diff compares two profiles again with "
        "other options"
    )
    assert main(["diff", saved, b]) == 2
    assert "it is a diff of two profiles ('layerscope show' shows it)" in capsys.readouterr().err


def test_a_diff_saved_without_its_profiles_is_refused_in_one_line(tmp_path: Path) -> None:
    model, x = _mlp()
    document = layerscope.diff(layerscope.count_flops(model, x), layerscope.count_flops(model, x)).to_dict()
    del document["profiles"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    with pytest.raises(LayerscopeError) as refused:
        layerscope.load(path)
    assert str(refused.value) == (
        f"{str(path)!r} is a diff saved without its two profiles ('profiles': base and new); "
        "run layerscope diff on the two profiles again"
    )
