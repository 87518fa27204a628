"""The architecture as a test: the folders are the layers, and imports flow one way, from
the layer that runs things down to the one data model and the utilities below it.

    app        the modules at the top (cli, session, block, loading, handlers, progress),
               compat/, integrations/, examples/, bench/
    capture    capture/, flops/, zoo/, traces/      (torch)
    render/ | attribute/ | convert/                 (pure, never each other)
    model/                                          (pure: the documents)
    base/                                           (pure: the utilities)

The rules are a contract in pyproject.toml (``[tool.importlinter]``), checked here by
import-linter: each layer imports only the layers below it (every import counts, the
ones inside functions too, ``if TYPE_CHECKING`` blocks aside), the capture layer never
reaches the renderers, the pure layers never import torch, and no two modules of a
package import each other round a circle. A document's ``render()``/``save()`` reach the
renderers through the registry in ``base/formats.py``, which the renderers fill, never by
importing them. The tests below also show that the contract fails where it should.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import layerscope

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(layerscope.__file__).parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
#: The modules that may sit loose at the top: the public API's entry points and the CLI.
MOST_LOOSE = 8


def _lint(cwd: Path, src: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contract, on the package under ``src``."""
    script = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    return subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
    )


def _layered() -> list[str]:
    """Every name the layers contract places, as ``layerscope.<name>``."""
    (contract,) = [c for c in CONFIG["contracts"] if c["type"] == "layers"]
    names = []
    for line in contract["layers"]:
        names += [n.strip() for n in line.replace("|", ":").split(":")]
    return [f"layerscope.{n}" for n in names]


def test_the_contract_is_kept():
    done = _lint(ROOT, SRC.parent)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_every_module_is_in_a_layer_and_few_are_loose_at_the_top():
    layered = _layered()
    unplaced = []
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(("layerscope", *parts)).removesuffix(".__init__")
        if name != "layerscope" and not any(name == p or name.startswith(p + ".") for p in layered):
            unplaced.append(name)
    assert unplaced == []
    loose = sorted(p.name for p in SRC.glob("*.py"))
    assert len(loose) <= MOST_LOOSE, loose


def _copy(tmp_path: Path) -> Path:
    """The package and its contract, copied where a test may break them."""
    shutil.copytree(SRC, tmp_path / "src" / "layerscope", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path / "src" / "layerscope"


def test_the_contract_sees_a_renderer_reaching_the_package_root(tmp_path):
    """The loop a renderer once made by taking ``__version__`` from the package root
    (which imports the layers above it) breaks the layers."""
    package = _copy(tmp_path)
    chrome = package / "render" / "chrome.py"
    text = chrome.read_text(encoding="utf-8")
    assert "from layerscope.base.version import __version__" in text
    chrome.write_text(text.replace("from layerscope.base.version import", "from layerscope import"), encoding="utf-8")
    done = _lint(tmp_path, tmp_path / "src")
    assert done.returncode != 0
    assert "layerscope.render is not allowed to import" in done.stdout, done.stdout[-3000:]


def test_the_contract_sees_torch_in_a_pure_layer_and_a_circle(tmp_path):
    package = _copy(tmp_path)
    walk = package / "attribute" / "walk.py"
    walk.write_text(walk.read_text(encoding="utf-8") + "\n\ndef _f():\n    import torch.nn  # noqa\n", encoding="utf-8")
    stats = package / "base" / "stats.py"
    stats.write_text(stats.read_text(encoding="utf-8") + "\n\ndef _g():\n    from layerscope.base import fmt  # noqa\n", encoding="utf-8")
    fmt = package / "base" / "fmt.py"
    fmt.write_text(fmt.read_text(encoding="utf-8") + "\n\ndef _h():\n    from layerscope.base import stats  # noqa\n", encoding="utf-8")
    done = _lint(tmp_path, tmp_path / "src")
    assert done.returncode != 0
    assert "layerscope.attribute is not allowed to import torch" in done.stdout, done.stdout[-3000:]
    assert "No cycles are allowed in layerscope.base" in done.stdout, done.stdout[-3000:]


def test_a_moved_module_still_imports_under_its_old_name_with_a_warning():
    import importlib

    import pytest

    from layerscope.base.moved import MOVED
    from layerscope.model import tree

    old_name = "layerscope" + ".tree"  # spelt apart: the old name, not the new
    with pytest.warns(DeprecationWarning, match=r"layerscope\.tree is layerscope\.model\.tree now"):
        old = importlib.import_module(old_name)
    assert old.Profile is tree.Profile
    for name, now in MOVED.items():
        importlib.import_module(now)  # every target exists
        assert name.startswith("layerscope.") and name != now
