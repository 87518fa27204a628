"""torch's private API goes through one seam, ``capture/_torch.py``: every private name
layerscope uses is listed there and present in this torch, and no other module of
layerscope reaches into torch's internals (an AST scan, with a test that shows the scan
can fail)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

import layerscope
from layerscope.capture import _torch
from layerscope.capture._torch import PRIVATE, Entry, Missing, MissingTorchAPI

SRC = Path(layerscope.__file__).parent
SEAM = SRC / "capture" / "_torch.py"
PYPROJECT = SRC.parent.parent / "pyproject.toml"


# -- the registry ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_this_torch_has_every_private_name_the_seam_lists(name: str) -> None:
    found = _torch.get(name)  # lazy entries are looked up here (Dynamo is imported)
    assert not isinstance(found, Missing), found.error() if isinstance(found, Missing) else None


@pytest.mark.parametrize("name", sorted(PRIVATE))
def test_every_entry_says_what_it_is_for_since_when_and_without_it(name: str) -> None:
    entry = PRIVATE[name]
    assert entry.name == name and entry.need and entry.evidence and entry.without
    if entry.since is None:
        assert entry.evidence.startswith("not established"), entry
    else:
        assert re.fullmatch(r"\d+\.\d+", entry.since), entry
        assert "pytorch#" in entry.evidence or "released" in entry.evidence, entry  # the PR, or the release


def test_pyproject_requires_the_floor_the_seam_establishes() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    torch_pins = [d for d in dependencies if re.match(r"torch\b", d)]
    assert torch_pins == [f"torch>={_torch.floor()}"]


def test_the_floor_is_decided_by_an_entry_that_is_not_tolerated() -> None:
    deciding = [e for e in PRIVATE.values() if e.since == _torch.floor()]
    assert deciding and not all(e.tolerated for e in deciding)
    # A tolerated entry never raises the floor: absence is allowed by design.
    floor = _release(_torch.floor())
    assert all(e.since is None or _release(e.since) <= floor or e.tolerated for e in PRIVATE.values())


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_nothing_is_missing_here_so_profiles_declare_nothing() -> None:
    assert _torch.missing() == [] and _torch.missing_meta() == {}


# -- a torch without a name: that feature fails loudly, in one line, when used ------------


def _missing(name: str) -> Missing:
    return Missing(PRIVATE[name], "AttributeError: not in this torch")


def test_a_missing_name_raises_one_line_naming_the_api_release_and_feature() -> None:
    gone = _missing("torch._C._autograd._get_sequence_nr")
    assert not gone
    with pytest.raises(MissingTorchAPI) as raised:
        gone()
    message = str(raised.value)
    assert "\n" not in message
    assert "torch._C._autograd._get_sequence_nr (torch >= 2.1)" in message
    assert message.startswith("backward attribution")
    with pytest.raises(MissingTorchAPI):
        gone.anything  # noqa: B018  # reading from it raises too
    assert not issubclass(MissingTorchAPI, (RuntimeError, AttributeError, TypeError))  # never swallowed as torch's


def test_a_missing_name_with_no_known_release_says_so() -> None:
    entry = Entry("torch._C._imaginary", "imagining", None, "not established", "nothing")
    assert "first torch release not established" in str(Missing(entry, "gone").error())


def test_without_the_fast_range_kineto_capture_refuses_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from layerscope.capture import kineto

    monkeypatch.setattr(_torch, "FastRange", _missing("torch._C._profiler._RecordFunctionFast"))
    with pytest.raises(MissingTorchAPI, match=r"_RecordFunctionFast \(torch >= 2\.1\)"):
        kineto.available()


def test_without_a_required_name_require_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "torch.nn.modules.module._global_forward_hooks_with_kwargs"
    monkeypatch.setitem(_torch._FOUND, name, _missing(name))
    with pytest.raises(MissingTorchAPI, match=r"torch >= 2\.6"):
        _torch.forget_hook_kwargs_flag(None, None)  # type: ignore[arg-type]


def test_a_tolerated_name_missing_is_declared_and_its_feature_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "torch._C._profiler._ExperimentalConfig(capture_overload_names=)"
    monkeypatch.setitem(_torch._FOUND, name, _missing(name))
    assert _torch.profiler_config(True, False, False) is not None  # default overloads assumed
    assert _torch.missing_meta() == {"torch_api_missing": {name: PRIVATE[name].without}}
    concrete = "torch._C._autograd._KinetoEvent.concrete_inputs"
    monkeypatch.setattr(_torch, "_concrete", _missing(concrete))
    assert _torch.concrete_inputs(object()) is None


# -- no private torch API outside the seam -----------------------------------------------

#: Where a module outside the seam may still reach a private name, and why. Keep it short.
ALLOWED: set[tuple[str, str]] = set()

#: Private attribute names the seam reads on torch's objects (``node._sequence_nr()``,
#: ``storage._cdata``...): reading them anywhere else bypasses it. One ending in ``_``
#: is a prefix (``_raw_saved_*``).
PRIVATE_ATTRIBUTES = frozenset(
    found.group(1)
    for name in PRIVATE
    if (found := re.search(r"\.(_[a-z]\w*?)(?:\*|\(.*\))?$", name.split(":")[0]))
)
#: A string naming a private module or object of torch's (``"torch._dynamo"``).
_PRIVATE_PATH = re.compile(r"^torch(\.\w+)*\._[a-zA-Z]\w*(\.\w+)*$")
#: Reading a function's closure (torch.profiler.schedule's settings).
_CLOSURES = frozenset({"__closure__", "getclosurevars"})


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _private_attribute(name: str) -> bool:
    return name in PRIVATE_ATTRIBUTES or any(p.endswith("_") and name.startswith(p) for p in PRIVATE_ATTRIBUTES)


def _torch_names(tree: ast.AST) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """Each local name bound to torch or a part of it (``nn`` -> ``torch.nn``), and the
    imports of private parts."""
    aliases: dict[str, str] = {}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    if any(_private(p) for p in alias.name.split(".")):
                        found.append((node.lineno, f"import {alias.name}"))
                    aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "torch":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if any(_private(p) for p in full.split(".")):
                        found.append((node.lineno, f"from {node.module} import {alias.name}"))
                    aliases[alias.asname or alias.name] = full
    return aliases, found


def _chain(node: ast.Attribute) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None when it does not start at a name."""
    parts = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return [current.id, *reversed(parts)]


def private_uses(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each reach into torch's internals in ``source``: an import of
    a private part of torch, an attribute chain from torch through a private name, a
    private attribute the seam reads on torch's objects (or its name as a string, as
    ``getattr`` takes it), a string naming a private part of torch, and reading a
    closure."""
    tree = ast.parse(source)
    aliases, found = _torch_names(tree)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if _private_attribute(node.attr):
                found.append((node.lineno, f".{node.attr}"))
            if node.attr in _CLOSURES:
                found.append((node.lineno, f".{node.attr} (reading a closure)"))
            chain = _chain(node) if id(node) not in inner else None
            if chain is not None and chain[0] in aliases:
                full = [*aliases[chain[0]].split("."), *chain[1:]]
                if any(_private(p) for p in full[1:]):
                    found.append((node.lineno, ".".join(full)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _private_attribute(node.value) or _PRIVATE_PATH.match(node.value):
                found.append((node.lineno, repr(node.value)))
    return sorted(set(found))


def test_no_module_outside_the_seam_touches_private_torch_api() -> None:
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SEAM:
            continue
        where = path.relative_to(SRC).as_posix()
        for line, what in private_uses(path.read_text(encoding="utf-8")):
            if not any(where == file and name in what for file, name in ALLOWED):
                wrong.append(f"{where}:{line}: {what}")
    assert wrong == []


def test_the_scan_finds_each_kind_of_reach() -> None:
    source = """
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.modules import module as nn_module
from torch.utils import _pytree

torch._C._get_thing()
nn_module._global_forward_hooks_with_kwargs.pop(1)
F._private_helper(1)
node._sequence_nr()
node._raw_saved_self
getattr(storage, "_cdata")
"torch._dynamo" in sys.modules
inspect.getclosurevars(fn)
torch.nn.Linear(1, 1)
nn.Module
torch.__version__
"""
    assert private_uses(source) == [
        (3, "import torch._dynamo"),
        (6, "from torch._subclasses.fake_tensor import FakeTensorMode"),
        (8, "from torch.utils import _pytree"),
        (10, "torch._C._get_thing"),
        (11, "._global_forward_hooks_with_kwargs"),
        (11, "torch.nn.modules.module._global_forward_hooks_with_kwargs.pop"),
        (12, "torch.nn.functional._private_helper"),
        (13, "._sequence_nr"),
        (14, "._raw_saved_self"),
        (15, "'_cdata'"),
        (16, "'torch._dynamo'"),
        (17, ".getclosurevars (reading a closure)"),
    ]
