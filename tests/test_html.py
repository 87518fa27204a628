"""The HTML report: one self-contained file, safe with hostile names, and (in a real
headless chromium, through playwright) a page whose figures are the profile's.

The browser tests need ``pip install playwright`` (the test extra) and a chromium at
``/usr/bin/chromium`` (Debian's ``chromium`` package; ``LAYERSCOPE_CHROMIUM`` names
another). They are skipped, with the reason, when either is missing (conftest.py's
``browser`` fixture). Playwright's own browser download (``playwright install``) is
never used.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope.base import fmt
from layerscope.model.tree import ModuleNode, OpStats, PhaseStats, Profile
from layerscope.render import format_for_path
from layerscope.render.html import report_data, script_json

#: Where a screenshot is kept for people to look at (not part of the repository).
#: Where to keep the screenshots for a person to look at (``LAYERSCOPE_SCREENSHOTS=dir``);
#: by default they stay in the test's tmp folder, and the checkout is never written.
SCREENS = os.environ.get("LAYERSCOPE_SCREENSHOTS")

XSS_NAME = "<img src=x onerror=alert(1)>"
BREAKOUT_NAME = "</script><!--<script>alert(2)</script>"
#: A class whose name is markup: types come from user code too.
BoldLinear = type("<b>Bold</b>", (nn.Linear,), {})


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict([
        ("block", nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64))),
        (XSS_NAME, nn.ReLU()),
        (BREAKOUT_NAME, BoldLinear(64, 32)),
        ("head", nn.Linear(32, 4)),
    ]))
    return model


@pytest.fixture(scope="module")
def step() -> Profile:
    """A training step (forward, backward, loss), with memory and ops."""
    prof = layerscope.profile(_model(), torch.randn(8, 16), backward=True, warmup=1, repeat=1)
    layerscope.check_tree(prof)
    return prof


def _hand_built() -> Profile:
    """A profile with ops that have no FLOP formula (no real op lacks one today)."""
    ops = [
        OpStats("aten::foo", calls=2, cpu_time_ns=40, self_cpu_time_ns=40, input_shapes=[[2]], flops=None, macs=None, bytes=8),
        OpStats("aten::foo", calls=1, cpu_time_ns=10, self_cpu_time_ns=10, input_shapes=[[1]], flops=10, macs=5, bytes=4),
        OpStats("aten::bar", calls=1, cpu_time_ns=30, self_cpu_time_ns=30, input_shapes=[[1]], flops=None, macs=None, bytes=4),
    ]
    stats = PhaseStats(cpu_time_ns=80, self_cpu_time_ns=80, flops=10, self_flops=10, macs=5, self_macs=5, bytes=16, self_bytes=16)
    root = ModuleNode("", "Hand", forward=stats, ops=ops, unsupported_ops={"aten::foo": 2, "aten::bar": 1}, calls=1)
    prof = Profile(root, meta={"model": "Hand", "device": "cpu"})
    layerscope.check_tree(prof)
    return prof


def _embedded(page: str) -> Any:
    match = re.search(r'<script type="application/json" id="layerscope-data">(.*?)</script>', page, flags=re.S)
    assert match, "no data element"
    return json.loads(match.group(1))


# -- without a browser ------------------------------------------------------------------


def test_the_page_loads_nothing_from_anywhere(step: Profile) -> None:
    page = step.render("html")
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""\b(src|href)\s*=\s*["']?\s*(https?:)?//""", page, flags=re.I)
    assert not re.search(r"@import|url\(", page)
    # The only absolute URL is the SVG namespace, which is a name, not a load.
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}
    # Exactly two script elements: the data and the code; no external one.
    assert len(re.findall(r"<script\b", page)) == 2


def test_the_embedded_json_round_trips_and_cannot_break_out(step: Profile) -> None:
    page = step.render("html")
    data = _embedded(page)
    assert data == json.loads(json.dumps(report_data(step)))
    paths = {node["path"] for node in data["nodes"]}
    assert {XSS_NAME, BREAKOUT_NAME} <= paths
    assert "<b>Bold</b>" in {node["type"] for node in data["nodes"]}
    # The names' markup never appears raw: only the escapes.
    start = page.index('id="layerscope-data">')
    body = page[start + len('id="layerscope-data">'): page.index("</script>", start)]
    assert "<" not in body and ">" not in body and "&" not in body
    assert "\\u003c/script\\u003e" in body
    assert XSS_NAME not in page and BREAKOUT_NAME not in page
    assert script_json({"a": "</script><!--&"}) == '{"a":"\\u003c/script\\u003e\\u003c!--\\u0026"}'


def test_the_policy_allows_only_the_pages_own_script(step: Profile) -> None:
    page = step.render("html")
    script = page[page.rindex("<script>") + len("<script>"): page.rindex("</script>")]
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert f"script-src 'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy


def test_the_format_is_registered_and_deterministic(step: Profile, tmp_path: Path) -> None:
    assert format_for_path("report.html") == "html"
    assert step.render("html") == step.render("html")
    step.save(str(tmp_path / "report.html"))
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == step.render("html")
    again = layerscope.load(_saved(step, tmp_path))
    assert _embedded(again.render("html"))["nodes"] == _embedded(step.render("html"))["nodes"]


def _saved(prof: Profile, folder: Path) -> str:
    path = folder / "step.json"
    prof.save(str(path))
    return str(path)


def test_a_profile_without_ops_or_memory_still_renders() -> None:
    prof = layerscope.profile(nn.Linear(4, 4), torch.randn(2, 4), warmup=0, repeat=1, record_ops=False, memory=False)
    data = _embedded(prof.render("html"))
    assert data["memory"] is None
    assert all(not table["rows"] for table in data["ops"].values())


# -- in a browser -------------------------------------------------------------------------


class Page:
    """A report open in the browser, with what it logged and any dialog it opened."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready]", timeout=10_000)

    def visible_paths(self) -> list[str]:
        return self.page.eval_on_selector_all("#tree-table tbody tr[data-path]", "rows => rows.map(r => r.dataset.path)")


@pytest.fixture
def open_html(browser: Any) -> Iterator[Any]:
    """``open_html(path)``: a page in the browser; at the end, none may have logged an
    error or opened a dialog."""
    pages: list[Page] = []

    def open_(path: Path) -> Page:
        pages.append(Page(browser, path))
        return pages[-1]

    yield open_
    for opened in pages:
        assert opened.errors == [], opened.errors
        assert opened.dialogs == []
        opened.page.close()


@pytest.fixture
def open_report(open_html: Any, tmp_path: Path) -> Any:
    def open_(prof: Profile, name: str = "report.html") -> Page:
        path = tmp_path / name
        prof.save(str(path))
        return open_html(path)

    return open_


@pytest.mark.browser
def test_the_root_row_shows_the_profiles_figures(open_report: Any, step: Profile, tmp_path: Path) -> None:
    report = open_report(step)
    root = step.root
    expected = {
        "forward_self": (root.forward.self_cpu_time_ns, fmt.time_ns),
        "forward_total": (root.forward.cpu_time_ns, fmt.time_ns),
        "backward_self": (root.backward.self_cpu_time_ns, fmt.time_ns),
        "backward_total": (root.backward.cpu_time_ns, fmt.time_ns),
        # A step's FLOPs per phase, as the text tree shows them (never one sum).
        "forward_flops": (root.forward.flops, fmt.count),
        "backward_flops": (root.backward.flops, fmt.count),
        "alloc": (root.forward.alloc_bytes + root.backward.alloc_bytes, fmt.nbytes),
        "activations": (root.forward.activation_bytes, fmt.nbytes),
        "params": (root.params_total, fmt.count),
    }
    cells = report.page.eval_on_selector_all(
        '#tree-table tbody tr[data-path=""] td[data-key]',
        "cells => cells.map(c => [c.dataset.key, c.dataset.value, c.textContent])",
    )
    shown = {key: (value, text) for key, value, text in cells}
    for key, (value, formatter) in expected.items():
        assert shown[key] == (str(value), formatter(value)), key
    # The step's parts are top-level rows, after the model.
    top = report.page.eval_on_selector_all(
        "#tree-table tbody tr[data-path]", "rows => rows.filter(r => !r.querySelector('td.name').style.paddingLeft.startsWith('20')).map(r => r.dataset.path)"
    )
    assert [part.path for part in step.parts] == [p for p in top if p.startswith("<")]
    # The header's step breakdown names every part.
    legend = report.page.inner_text("header .legend")
    for part in step.parts:
        assert part.path in legend
    _screenshot(report, tmp_path, "step.png")


@pytest.mark.browser
def test_expanding_sorting_and_searching_the_tree(open_report: Any, step: Profile) -> None:
    report = open_report(step)
    page = report.page
    assert report.visible_paths() == ["", "block", XSS_NAME, BREAKOUT_NAME, "head", *(p.path for p in step.parts)]
    page.click('#tree-table tr[data-path="block"] button.toggle')
    assert report.visible_paths()[1:5] == ["block", "block.0", "block.1", "block.2"]
    page.click('#tree-table tr[data-path="block"] button.toggle')
    assert "block.0" not in report.visible_paths()

    # Sorting reorders siblings by the column's raw value, descending then ascending.
    def children_by(key: str) -> list[float]:
        return page.eval_on_selector_all(
            f'#tree-table tbody tr[data-path]:not([data-path=""]):not([data-path^="<"]) td[data-key="{key}"]',
            "cells => cells.map(c => Number(c.dataset.value))",
        )

    children = [c for c in step.root.children]
    page.click('#tree-table th[data-key="params"]')
    assert report.visible_paths()[1:5] == [c.path for c in sorted(children, key=lambda c: -c.params_total)]
    assert children_by("params") == sorted(children_by("params"), reverse=True)
    page.click('#tree-table th[data-key="params"]')
    assert children_by("params") == sorted(children_by("params"))
    assert report.visible_paths()[0] == ""  # the model stays above its children

    # The search keeps matches and their ancestors, and nothing else.
    page.fill("#tree-search", "relu")
    page.wait_for_function("() => document.getElementById('tree-count').textContent.includes('match')")
    assert sorted(report.visible_paths()) == sorted(["", "block", "block.1", XSS_NAME])
    page.fill("#tree-search", "")
    page.wait_for_function("() => !document.getElementById('tree-count').textContent.includes('match')")
    assert "block.1" not in report.visible_paths()


@pytest.mark.browser
def test_hostile_names_stay_text(open_report: Any, step: Profile) -> None:
    report = open_report(step)
    page = report.page
    page.fill("#tree-search", "")
    label = page.eval_on_selector(f'#tree-table tr[data-path="{XSS_NAME}"] span.label', "e => e.textContent")
    assert label == XSS_NAME
    assert page.eval_on_selector(f'#tree-table tr[data-path="{BREAKOUT_NAME}"] td[data-key="type"]', "e => e.textContent") == "<b>Bold</b>"
    counts = page.evaluate(
        "() => ({img: document.querySelectorAll('img').length, b: document.querySelectorAll('b').length,"
        " scripts: document.querySelectorAll('script').length})"
    )
    assert counts == {"img": 0, "b": 0, "scripts": 2}
    # Hovering the icicle shows the names as text too.
    page.hover("#icicle g.box:not(.ancestor)")
    assert page.is_visible("#tooltip")
    assert report.dialogs == []


@pytest.mark.browser
def test_the_icicle_switches_metric_and_zooms(open_report: Any, step: Profile) -> None:
    report = open_report(step)
    page = report.page
    assert page.get_attribute("#icicle", "data-metric") == "time"

    def widths() -> dict[str, float]:
        return dict(page.eval_on_selector_all(
            "#icicle g.box", "gs => gs.map(g => [g.dataset.index, Number(g.querySelector('rect').getAttribute('width'))])"
        ))

    by_time = widths()
    page.click('#icicle-section button[data-metric="flops"]')
    assert page.get_attribute("#icicle", "data-metric") == "flops"
    assert widths() != by_time
    assert "FLOPs" in page.inner_text("#icicle-section button.active")
    page.click('#icicle-section button[data-metric="memory"]')
    assert page.get_attribute("#icicle", "data-metric") == "memory"
    # Clicking a box zooms into it: it spans the whole width.
    index = str([n.path for n in step.nodes()].index("block"))
    page.click(f'#icicle g.box[data-index="{index}"]')
    assert page.inner_text("#icicle-focus").startswith("block:")
    full = max(widths().values())
    assert widths()[index] == full


@pytest.mark.browser
def test_the_op_table_and_memory_timeline(open_report: Any, step: Profile) -> None:
    report = open_report(step)
    page = report.page
    rows = page.eval_on_selector_all("#ops-table tbody tr", "rows => rows.length")
    assert rows == len(step.ops(group_by="name"))
    first = page.eval_on_selector("#ops-table tbody tr td", "td => td.textContent")
    assert first == step.ops(group_by="name").rows[0].name
    page.click('#ops button[data-group="module"]')
    assert "Module" in page.inner_text("#ops-table thead")
    # A training step's ops by module are told apart by phase too.
    assert "Phase" in page.inner_text("#ops-table thead")
    by_module = step.ops(group_by="module,phase")
    assert page.eval_on_selector_all("#ops-table tbody tr", "rows => rows.length") == len(by_module)
    # Sorting by calls, descending.
    page.click('#ops-table th:has-text("Calls")')
    calls = page.eval_on_selector_all('#ops-table tbody tr td:nth-child(4)', "tds => tds.map(t => Number(t.dataset.value))")
    assert calls == sorted(calls, reverse=True)
    # The memory timeline, with its peak.
    assert page.eval_on_selector("#memory-chart polyline", "p => p.getAttribute('points').split(' ').length") == len(
        step.memory.timeline.t_ns
    )
    assert fmt.nbytes(step.memory.peak_bytes) in page.inner_text("#memory")


@pytest.mark.browser
def test_ops_without_a_formula_are_marked(open_report: Any) -> None:
    prof = _hand_built()
    report = open_report(prof, "hand.html")
    rows = report.page.eval_on_selector_all(
        "#ops-table tbody tr", "rows => rows.map(r => [r.className, r.cells[0].textContent])"
    )
    assert ["unsupported", "aten::foono formula"] in rows
    assert ["unsupported", "aten::barno formula"] in rows
    headers = report.page.eval_on_selector_all("#ops-table thead th", "ths => ths.map(th => th.textContent)")
    at = headers.index("FLOPs")
    flops = dict(report.page.eval_on_selector_all(
        "#ops-table tbody tr", f"rows => rows.map(r => [r.cells[0].firstChild.textContent, r.cells[{at}].textContent])"
    ))
    # A lower bound is marked, an unknown is "?": never 0.
    assert flops == {"aten::foo": "10 + ?", "aten::bar": "?"}
    # The tree's row of the module that ran them, and the header, mark it the same way.
    cells = report.page.eval_on_selector_all(
        "#tree-table tbody tr[data-path=''] td[data-key='flops'], #tree-table tbody tr[data-path=''] td[data-key='macs']",
        "tds => tds.map(td => td.textContent)",
    )
    assert cells == ["10 + ?", "5 + ?"]
    assert "10 + ? (forward); MACs 5 + ?" in report.page.inner_text("body")


@pytest.mark.browser
def test_a_wide_tree_builds_rows_on_demand(open_report: Any, tmp_path: Path) -> None:
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(450)])
    prof = layerscope.count_flops(model, torch.randn(1, 2))
    report = open_report(prof, "wide.html")
    page = report.page
    assert len(report.visible_paths()) == 1 + 200  # the root and its first page of children
    page.click("#tree-table button.more")
    assert len(report.visible_paths()) == 1 + 450
    page.click("#tree-collapse")
    assert report.visible_paths() == [""]
    _screenshot(report, tmp_path, "wide.png")


def _screenshot(report: Page, tmp_path: Path, name: str) -> None:
    report.page.screenshot(path=str(tmp_path / name), full_page=True)
    if SCREENS:
        Path(SCREENS).mkdir(parents=True, exist_ok=True)
        report.page.screenshot(path=str(Path(SCREENS) / name), full_page=True)


@pytest.mark.browser
def test_the_header_shows_the_steps_spread_and_names_the_far_ones(open_report: Any) -> None:
    model = _model()
    with layerscope.Profiler(model) as prof:
        for _ in range(3):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
    profile = layerscope.check_tree(prof.profile)
    # Steps 0 to 5, one of them (4) far from the median: 5 x the others' 1 ms. p90 lies halfway
    # between the fifth and sixth of the sorted six (position 4.5): 1 + (5 - 1) / 2 = 3 ms.
    profile.figures.step_times_ns, profile.figures.step_numbers = [1_000_000] * 4 + [5_000_000, 1_000_000], list(range(6))
    header = open_report(profile).page.inner_text("header .facts")
    assert "median 1.000ms, p90 3.000ms, min 1.000ms, max 5.000ms over 6 steps" in header
    assert "step 4 5.000ms (x5.0)" in header
    # A step's FLOPs sum its phases: the header says which, not a bare figure.
    root = profile.root
    assert f"{fmt.count(root.forward.flops + root.backward.flops)}: forward {fmt.count(root.forward.flops)} + backward" in header


@pytest.mark.browser
def test_a_real_mi300x_training_traces_report(open_report: Any, shared_traces: Path, tmp_path: Path) -> None:
    # A torch.profiler trace recorded elsewhere (ResNet under DDP with activation
    # checkpointing, rank 0 of 8 on an AMD MI300X): the checkpointed blocks run their
    # forward again in backward, so the tree carries a recompute phase.
    profile = layerscope.load(shared_traces / "mi300x_resnet_ddp_actckpt_train_rank0.json.gz")
    resnet = profile["ResNet_0"]
    assert resnet.recompute is not None and resnet.recompute.cpu_time_ns > 0
    report = open_report(profile, "mi300x.html")
    page = report.page
    # DDP's forward range encloses the model's calls: the model is its child, one click in.
    assert profile["ResNet_0"].parent == "[DistributedDataParallel.forward]"
    assert "ResNet_0" not in report.visible_paths()
    page.click('#tree-table tr[data-path="[DistributedDataParallel.forward]"] button.toggle')
    assert "ResNet_0" in report.visible_paths()
    label = page.eval_on_selector('#tree-table tr[data-path="ResNet_0"] span.label', "e => e.textContent")
    assert label == "ResNet_0"
    # The recompute figure, in the tree's own column for that phase.
    assert page.eval_on_selector('#tree-table thead th[data-key="recompute_total"]', "th => th.textContent").startswith(
        "Recompute total"
    )
    cell = page.eval_on_selector(
        '#tree-table tr[data-path="ResNet_0"] td[data-key="recompute_total"]', "c => [c.dataset.value, c.textContent]"
    )
    assert cell == [str(resnet.recompute.cpu_time_ns), fmt.time_ns(resnet.recompute.cpu_time_ns)]
    assert "AMD Instinct MI300X" in page.inner_text("header .facts")
    assert report.errors == [] and report.dialogs == []
    _screenshot(report, tmp_path, "mi300x.png")


@pytest.mark.browser
def test_a_transformers_training_steps_op_table_fits_1400_pixels(open_report: Any, tmp_path: Path) -> None:
    # GPT-2's module paths (transformer.h.0.attn.c_attn) and shapes are long: grouped by
    # module, with a phase column, the table still fits a 1400 px window; the cut text
    # is whole in the cell's title. The header says how noisy the figures are.
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 128, (2, 16))
    prof = layerscope.profile(model, {"input_ids": ids, "labels": ids}, backward=True,
                              loss_fn=lambda out: out.loss, warmup=1, repeat=3)
    report = open_report(layerscope.check_tree(prof), "gpt2.html")
    page = report.page
    page.click('#ops button[data-group="module"]')
    head = page.inner_text("#ops-table thead")
    assert "Phase" in head and "Modules" not in head  # one module per row: no count column
    sizes = page.eval_on_selector("#ops .scroll", "s => [s.scrollWidth, s.clientWidth]")
    assert sizes[0] <= sizes[1], sizes
    titles = page.eval_on_selector_all("#ops-table td.cut[title]", "tds => tds.map(t => t.title)")
    assert any(title.startswith("transformer.h.") for title in titles)
    spread = prof.pass_spread()
    assert spread is not None
    assert f"±{100 * spread:.1f}%: the 3 passes' spread" in page.inner_text("header .facts")


@pytest.mark.browser
def test_one_pass_says_its_noise_is_not_measured(open_report: Any, step: Profile) -> None:
    assert step.pass_spread() is None  # repeat=1
    header = open_report(step).page.inner_text("header .facts")
    assert "not measured: one pass" in header


@pytest.mark.browser
def test_a_compiled_blocks_report_shows_its_device_time_and_unknown_part_counts(open_report: Any) -> None:
    from test_compiled_block import device_block_profile

    profile = device_block_profile()
    report = open_report(profile, "compiled_block.html")
    page = report.page
    assert report.errors == [] and report.dialogs == []
    rows = report.visible_paths()
    assert "fc" in rows and "<optimizer:AdamW>" in rows and "<loss>" in rows
    assert "each node's median over the steps, the 1 that compiled left out" in page.inner_text("header .facts")
    fc_self = page.eval_on_selector('#tree-table tr[data-path="fc"] td[data-key="forward_self"]', "c => c.dataset.value")
    assert fc_self == str(profile["fc"].forward.self_cpu_time_ns)
    # A step part's FLOPs are unknown: no figure, never 0.
    flops = page.eval_on_selector('#tree-table tr[data-path="<optimizer:AdamW>"] td[data-key="forward_flops"]', "c => c.textContent")
    assert flops.strip() in ("", "?", "-")


@pytest.mark.browser
def test_a_light_step_blocks_report_says_which_steps_gave_which_figures(open_report: Any) -> None:
    from test_light_steps import _cycle_profile

    profile = _cycle_profile()
    report = open_report(profile, "light_steps.html")
    facts = report.page.inner_text("header .facts")
    assert "each node's mean over the 2 light steps" in facts
    assert "op rows from step 0, recorded in detail" in facts
    a_self = report.page.eval_on_selector(
        '#tree-table tr[data-path="a"] td[data-key="forward_self"]', "c => c.dataset.value"
    )
    assert a_self == "51"  # the light steps' mean, not the detailed step's time
