"""Property tests, on a fixed budget so they run with the rest of the suite.

- Random and corrupted JSON fed to ``layerscope.load`` and ``layerscope show`` never
  gives anything but a profile or a ``SchemaError`` (exit 0 or 2).
- A saved profile loaded and saved again gives the same bytes.
- Random module trees, built as real ``nn.Module``s (nesting, a module shared by two
  parents, a module called twice, modules never called), counted and profiled, give
  sound trees whose calls, parameters and MACs match the model's own arithmetic.

``derandomize=True``: every run tries the same examples, so a failure is repeatable.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import layerscope
from layerscope.base.errors import SchemaError
from layerscope.cli import main
from layerscope.model.check import check_tree
from layerscope.model.tree import Profile

FIXED = {"deadline": None, "derandomize": True, "database": None,
         "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _show(path: Path) -> tuple[int, str, str]:
    """``layerscope show PATH`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["show", str(path)])
    return status, out.getvalue(), err.getvalue()


def _load_and_show(path: Path) -> Profile | None:
    """Load ``path`` and show it: a profile (shown, exit 0) or a SchemaError (exit 2 and
    one line naming the file); anything else fails the test."""
    try:
        profile = layerscope.load(path)
    except SchemaError as exc:
        assert path.name in str(exc)
        status, out, err = _show(path)
        assert (status, out) == (2, ""), err
        assert len(err.splitlines()) == 1 and path.name in err
        return None
    check_tree(profile)
    status, out, err = _show(path)
    assert status == 0, err
    assert out == profile.render("text")
    json.loads(profile.render("json"))  # and it can be saved again
    return profile


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("properties")


def _step_profile() -> Profile:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    with layerscope.Profiler(model) as prof:
        with layerscope.label("data"):
            x = torch.randn(3, 4)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    return prof


@pytest.fixture(scope="module")
def saved_docs() -> list[dict[str, Any]]:
    """Two sound profiles as documents: a forward pass, and a training step with labels,
    memory and a trace."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))
    forward = layerscope.profile(model, torch.rand(1, 1, 6, 6), warmup=0, repeat=2)
    return [json.loads(forward.render("json")), json.loads(_step_profile().render("json"))]


# -- random and corrupted files ---------------------------------------------------------


@settings(max_examples=60, **FIXED)
@given(doc=json_values)
def test_random_json_is_refused_in_one_line(folder: Path, doc: Any) -> None:
    path = folder / "random.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert _load_and_show(path) is None


@settings(max_examples=60, **FIXED)
@given(doc=st.fixed_dictionaries(
    {"schema": st.just("layerscope/1")},
    optional={key: json_values for key in ("meta", "totals", "modules", "parts", "memory", "trace")},
))
def test_random_fields_under_the_right_schema(folder: Path, doc: Any) -> None:
    path = folder / "fields.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    _load_and_show(path)


def _places(doc: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document (a path of keys and indexes), the root excluded."""
    places = [where] if where else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            places += _places(value, (*where, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            places += _places(value, (*where, index))
    return places


def _parent(doc: Any, place: tuple[Any, ...]) -> Any:
    for step in place[:-1]:
        doc = doc[step]
    return doc


@dataclass
class Corruption:
    """A change to a sound document: one value replaced, one entry removed, or the text
    cut short or with a character changed."""

    which: int
    place: int
    value: Any
    cut: float
    char: str

    def apply(self, doc: dict[str, Any]) -> str:
        doc = json.loads(json.dumps(doc))
        places = _places(doc)
        place = places[self.place % len(places)]
        kind = self.which % 4
        if kind == 0:
            _parent(doc, place)[place[-1]] = self.value
        elif kind == 1:
            del _parent(doc, place)[place[-1]]
        text = json.dumps(doc)
        at = int(self.cut * len(text))
        if kind == 2:
            return text[:at]
        if kind == 3:
            return text[:at] + self.char + text[at + 1 :]
        return text


corruptions = st.builds(
    Corruption, st.integers(0, 3), st.integers(0, 10**6), json_values, st.floats(0, 1), st.characters()
)


@settings(max_examples=150, **FIXED)
@given(index=st.integers(0, 1), corruption=corruptions)
def test_corrupted_profiles_load_or_are_refused(
    folder: Path, saved_docs: list[dict[str, Any]], index: int, corruption: Corruption
) -> None:
    path = folder / "corrupted.json"
    path.write_text(corruption.apply(saved_docs[index]), encoding="utf-8")
    _load_and_show(path)


# -- random module trees ----------------------------------------------------------------

WIDTH = 4  # every module maps (batch, 4) -> (batch, 4), so any tree composes


class Block(nn.Module):
    """A container that calls its children in the order ``calls`` says: an index twice is
    a module called twice, an index never named is a module never called."""

    def __init__(self, children: list[nn.Module], calls: list[int]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(children)
        self.calls = calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index in self.calls:
            x = self.parts[index](x)
        return x


LEAVES: dict[str, Callable[[], nn.Module]] = {
    "linear": lambda: nn.Linear(WIDTH, WIDTH), "relu": nn.ReLU, "tanh": nn.Tanh,
    "nobias": lambda: nn.Linear(WIDTH, WIDTH, bias=False),
}


@st.composite
def blueprints(draw: Any, depth: int = 0) -> Any:
    """("leaf", kind) or ("block", [children], calls): a tree of modules to build."""
    if depth >= 3 or draw(st.booleans()):
        return ("leaf", draw(st.sampled_from(sorted(LEAVES))))
    children = draw(st.lists(blueprints(depth + 1), min_size=1, max_size=3))
    calls = draw(st.lists(st.integers(0, len(children) - 1), max_size=4))
    return ("block", children, calls)


def build(blueprint: Any) -> nn.Module:
    if blueprint[0] == "leaf":
        return LEAVES[blueprint[1]]()
    return Block([build(child) for child in blueprint[1]], list(blueprint[2]))


def _blocks(module: nn.Module) -> list[Block]:
    return [m for m in module.modules() if isinstance(m, Block)]


def share(model: nn.Module, donor_pick: int, recipient_pick: int, call: bool) -> None:
    """Register one more parent for a module (a shared module), unless that would make a
    cycle; with ``call``, the new parent calls it too."""
    candidates = [m for m in model.modules() if m is not model and not isinstance(m, nn.ModuleList)]
    blocks = _blocks(model)
    if not candidates or not blocks:
        return
    donor = candidates[donor_pick % len(candidates)]
    recipient = blocks[recipient_pick % len(blocks)]
    if any(m is recipient for m in donor.modules()):
        return  # the recipient is inside the donor: a cycle
    recipient.parts.append(donor)
    if call:
        recipient.calls.append(len(recipient.parts) - 1)


def expected_calls(model: nn.Module) -> dict[int, int]:
    """How many times each module (by id) runs in one forward, from the structure."""
    calls: dict[int, int] = {}

    def run(module: nn.Module) -> None:
        calls[id(module)] = calls.get(id(module), 0) + 1
        if isinstance(module, Block):
            for index in module.calls:
                run(module.parts[index])

    run(model)
    return calls


def _check_against_the_model(prof: Profile, model: nn.Module, batch: int) -> None:
    check_tree(prof)
    named = dict(model.named_modules())  # first path of each unique module
    assert [node.path for node in prof.modules()] == list(named)
    calls = expected_calls(model)
    for path, module in named.items():
        assert prof[path].calls == calls.get(id(module), 0), path
    assert prof.root.params_total == sum(p.numel() for p in model.parameters())
    linear_calls = sum(calls.get(id(m), 0) for m in model.modules() if isinstance(m, nn.Linear))
    assert prof.root.forward.macs == linear_calls * batch * WIDTH * WIDTH


def _round_trip(prof: Profile, folder: Path) -> None:
    first, second = folder / "first.json", folder / "second.json"
    prof.save(first)
    loaded = layerscope.load(first)
    loaded.save(second)
    assert first.read_bytes() == second.read_bytes()


@settings(max_examples=40, **FIXED)
@given(
    blueprint=blueprints(), shares=st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99), st.booleans()), max_size=2),
    batch=st.integers(1, 3),
)
def test_random_module_trees(folder: Path, blueprint: Any, shares: list[tuple[int, int, bool]], batch: int) -> None:
    torch.manual_seed(0)
    model = build(blueprint)
    for donor, recipient, call in shares:
        share(model, donor, recipient, call)
    x = torch.randn(batch, WIDTH)
    counted = layerscope.count_flops(model, x)
    _check_against_the_model(counted, model, batch)
    _round_trip(counted, folder)
    timed = layerscope.profile(model, x, warmup=0, repeat=1)
    _check_against_the_model(timed, model, batch)
    _round_trip(timed, folder)


def test_round_trips_of_a_training_step(folder: Path) -> None:
    _round_trip(_step_profile(), folder)
