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


def _block(**options: Any) -> Callable[[Path], Any]:
    def make(_: Path) -> Any:
        model, x = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        with layerscope.Profiler(model, **options) as prof:
            for _ in range(3):
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
}


#: The kinds whose making takes a second or more here (a block's steps, a real trace):
#: in the slow tier.
SLOW_KINDS = {
    "block, every step detailed", "block, detail='first' (hooked light steps)", "block, record_ops=False",
    "trace with shapes", "trace without shapes or modules", "merged ranks",
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
