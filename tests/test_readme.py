"""Every example in the README runs: the Python blocks, and each CLI line."""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(lang: str, text: str | None = None) -> list[str]:
    text = README.read_text(encoding="utf-8") if text is None else text
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks("python")
    assert blocks, "the README has no Python example"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "alexnet.json").exists()


def test_docs_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for doc in ("memory.md", "flops.md", "migrating.md"):
        path = README.parent / "docs" / doc
        blocks = re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
        assert blocks, f"docs/{doc} has no Python example"
        for block in blocks:
            exec(compile(block, str(path), "exec"), {"__name__": "__docs__"})


def _cli_lines(text: str | None = None) -> list[list[str]]:
    lines = []
    for block in _blocks("bash", text):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith(("layerscope ", "torchrun ")):
                lines.append(shlex.split(line))
    return lines


def _command(argv: list[str], cwd: Path) -> list[str]:
    """The line as the shell would run it: globs expanded in ``cwd``, and ``torchrun``
    as this Python's ``torch.distributed.run``."""
    words = []
    for word in argv[1:]:
        found = sorted(glob.glob(word, root_dir=cwd)) if any(c in word for c in "*?[") else []
        words.extend(found or [word])
    if argv[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *words]
    return [sys.executable, "-m", "layerscope", *words]


@pytest.fixture(scope="module")
def shell_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for all the README's command lines, run in order, as a reader would:
    a line may read the file an earlier one wrote."""
    return tmp_path_factory.mktemp("readme_shell")


@pytest.mark.parametrize("argv", _cli_lines(), ids=lambda argv: " ".join(argv))
def test_readme_cli_lines_run(argv: list[str], shell_dir: Path) -> None:
    env = dict(os.environ)
    result = subprocess.run(
        _command(argv, shell_dir),
        cwd=shell_dir, capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_distributed_doc_lines_run(tmp_path: Path) -> None:
    """docs/distributed.md's command lines, in order, in one folder: the example job
    under torchrun, then merging, showing and diffing its files."""
    text = (README.parent / "docs" / "distributed.md").read_text(encoding="utf-8")
    lines = _cli_lines(text)
    assert lines[0][0] == "torchrun" and len(lines) > 8
    for argv in lines:
        result = subprocess.run(
            _command(argv, tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        assert "Traceback" not in result.stderr


def test_traces_doc_lines_run(tmp_path: Path) -> None:
    """docs/traces.md: each Python example in a process of its own (each runs torch's
    profiler, as a user's script would, once); then its command lines read the trace the
    first one wrote."""
    text = (README.parent / "docs" / "traces.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    for block in blocks:
        result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (block[:200], result.stderr[-2000:])
    lines = _cli_lines(text)
    assert len(lines) >= 5
    for argv in lines:
        result = subprocess.run(_command(argv, tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        assert "Traceback" not in result.stderr
