"""The HTML pages of the other documents (a diff, a merged run of ranks, a benchmark),
the diff and bench tables of the renderer registry, and their CLI.

Documents are built by hand (no model runs but the one ``bench`` CLI test). The pages
share the report's machinery (``render/html.py``: escaped JSON, the policy with the
script's hash, nothing loaded); the browser tests open each one in chromium, with the
fixture and CI guard of ``test_html.py``.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

import layerscope
import layerscope.base.io
from layerscope.bench import BatchResult, BenchResult
from layerscope.model.diff import ProfileDiff
from layerscope.model.documents import profile_from_dict
from layerscope.model.ranks import MergedRun, merge
from layerscope.model.tree import Profile
from layerscope.render import format_for_path, formats, render
from test_cli import run_cli
from test_html import XSS_NAME, Page, open_html  # noqa: F401  (the page fixture, on the session's browser)
from test_ranks import MS, four_ranks

BREAKOUT = "</script><!--"


def _renamed(profile: Profile, old: str, new: str) -> Profile:
    """``profile`` with the module ``old`` (and its children's paths) named ``new``."""
    text = json.dumps(profile.to_dict()).replace(json.dumps(old)[:-1], json.dumps(new)[:-1])
    return profile_from_dict(json.loads(text))


def hostile_ranks() -> list[Profile]:
    """test_ranks' four ranks, with ``head`` (rank 2's straggler) named as markup."""
    return [_renamed(p, "head", XSS_NAME) for p in four_ranks()]


def hostile_run() -> MergedRun:
    return merge(hostile_ranks())


def hostile_diff() -> ProfileDiff:
    """Rank 0 against rank 2: the hostile module's self time 5 -> 20 ms, the step
    34 -> 34.5 ms (rank 2 waits less)."""
    ranks = hostile_ranks()
    return layerscope.diff(ranks[0], ranks[2])


def bench_result() -> BenchResult:
    return BenchResult(
        model="<b>mlp</b>", mode="inference", device="cpu", dtype="float32", params=10, trainable_params=10,
        model_bytes_by_dtype={"float32": 40}, flops=100, macs=50, count_batch_size=1,
        batches=[
            BatchResult(1, times_ns=[100_000, 110_000, 120_000, 105_000], peak_memory_bytes=1000),
            BatchResult(8, times_ns=[400_000, 420_000, 430_000, 410_000], peak_memory_bytes=8000),
            BatchResult(32, status="oom"),
        ],
        settings={"warmup": 1, "min_runs": 4, "min_time_s": 0.0},
    )


def _embedded(page: str) -> Any:
    match = re.search(r'<script type="application/json" id="layerscope-data">(.*?)</script>', page, flags=re.S)
    assert match, "no data element"
    return json.loads(match.group(1))


PAGES = {
    "diff": lambda: hostile_diff().render("html"),
    "ranks": lambda: hostile_run().render("html"),
    "bench": lambda: bench_result().render("html"),
}


# -- the registry ---------------------------------------------------------------------


def test_every_document_has_text_json_and_html() -> None:
    for kind in ("diff", "bench", "ranks"):
        assert formats(kind)[:3] == ["text", "json", "html"], kind
        assert format_for_path("x.html", document=kind) == "html"
        assert format_for_path("x.json", document=kind) == "json"
    assert format_for_path("x.out", default="json", document="bench") == "json"
    assert formats("bench") == ["text", "json", "html", "png"]


def test_the_registry_renders_as_the_documents_did(monkeypatch: pytest.MonkeyPatch) -> None:
    from layerscope.render.bench_text import render_table
    from layerscope.render.diff_text import render_diff

    diff = hostile_diff()
    assert diff.render() == render_diff(diff) == render(diff, "text")
    monkeypatch.setattr("layerscope.base.formats.terminal_width", lambda: None)
    assert str(diff) == render(diff, "text", width=120)  # print() fits 120 where stdout is no terminal
    assert diff.render(limit=1) == render_diff(diff, limit=1)
    assert json.loads(diff.render("json")) == json.loads(json.dumps(diff.to_dict()))
    result = bench_result()
    assert result.render() == render_table(result) == str(result)
    assert result.render("json") == json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"


def test_save_follows_the_extension(tmp_path: Path) -> None:
    result = bench_result()
    result.save(tmp_path / "b.json")
    assert layerscope.load(tmp_path / "b.json") == result
    result.save(tmp_path / "b.html")
    assert (tmp_path / "b.html").read_text(encoding="utf-8") == result.render("html")
    diff = hostile_diff()
    diff.save(tmp_path / "d.html")
    assert (tmp_path / "d.html").read_text(encoding="utf-8") == diff.render("html")


# -- the pages without a browser ------------------------------------------------------


@pytest.mark.parametrize("kind", PAGES)
def test_a_page_is_self_contained_and_allows_only_its_script(kind: str) -> None:
    page = PAGES[kind]()
    assert page.startswith("<!DOCTYPE html>")
    assert page == PAGES[kind](), "not deterministic"
    assert not re.search(r"""\b(src|href)\s*=\s*["']?\s*(https?:)?//""", page, flags=re.I)
    assert not re.search(r"@import|url\(", page)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}
    assert len(re.findall(r"<script\b", page)) == 2
    script = page[page.rindex("<script>") + len("<script>"): page.rindex("</script>")]
    assert not re.search(r"\.(inner|outer)HTML\s*=|insertAdjacentHTML|document\.write|\beval\(", script)
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    assert policy.startswith("default-src 'none';") and f"script-src 'sha256-{digest}'" in policy


@pytest.mark.parametrize("kind", PAGES)
def test_names_reach_the_page_only_as_json_escapes(kind: str) -> None:
    page = PAGES[kind]()
    start = page.index('id="layerscope-data">') + len('id="layerscope-data">')
    body = page[start: page.index("</script>", start)]
    assert "<" not in body and ">" not in body and "&" not in body
    assert XSS_NAME not in page and "<b>mlp</b>" not in page


def test_the_diff_page_data_is_the_diffs() -> None:
    diff = hostile_diff()
    data = _embedded(diff.render("html"))
    summary = {name: (base, new) for name, base, new in data["summary"]}
    assert summary["time_ns"] == (34 * MS, 34_500_000) == (diff.summary["time_ns"].base, diff.summary["time_ns"].new)
    # Without --fail-above the page marks what a 10% gate would, at the diff's floor.
    assert data["threshold"] == 0.1 and not data["gated"]
    assert [r["path"] for r in data["regressions"]] == [r.path for r in diff.regressions(0.1)]
    assert XSS_NAME in [r["path"] for r in data["regressions"]]
    gated = _embedded(diff.render("html", fail_above=0.5))
    assert gated["threshold"] == 0.5 and gated["gated"]
    assert [r["path"] for r in gated["regressions"]] == [XSS_NAME]  # the step grew 1.5% only


def test_the_ranks_page_data_is_the_runs() -> None:
    run = hostile_run()
    data = _embedded(run.render("html"))
    heat = {(data["nodes"][row["node"]]["path"], row["phase"]): row for row in data["heat"]}
    row = heat[(XSS_NAME, "forward")]
    assert row["time"] == [v for v, _ in run.values_by_rank(XSS_NAME, "forward", "time_ns")] == [5 * MS, 5_500_000, 20 * MS, 5 * MS]
    assert row["time_median"] == run.spread(XSS_NAME, "forward").median
    assert row["self_median"] == run.spread(XSS_NAME, "forward", "self_time_ns").median
    assert data["stragglers"] == [s.to_dict() for s in run.stragglers()]
    assert data["waiting"] == [w.to_dict() for w in run.waiting()]


def test_the_bench_page_data_is_the_results() -> None:
    result = bench_result()
    data = _embedded(result.render("html"))
    by_size = {b["batch_size"]: b for b in data["batches"]}
    assert by_size[8]["p50_ns"] == result.batch(8).p50_ns
    assert by_size[8]["throughput_per_s"] == result.batch(8).throughput_per_s
    assert by_size[32]["status"] == "oom" and by_size[32]["p50_ns"] is None


# -- the CLI --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pages")
    for profile in hostile_ranks():
        profile.save(str(folder / f"rank{profile.meta.rank}.json"))
    bench_result().save(folder / "bench.json")
    return folder


def test_cli_diff_merge_and_show_write_pages(files: Path, tmp_path: Path) -> None:
    done = run_cli("diff", str(files / "rank0.json"), str(files / "rank2.json"), "-o", "d.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "layerscope: wrote the html diff to d.html\n"
    diff = layerscope.diff(layerscope.load(files / "rank0.json"), layerscope.load(files / "rank2.json"))
    assert (tmp_path / "d.html").read_text(encoding="utf-8") == diff.render("html")
    # --fail-above: the verdict on stderr, the gate's regressions on the page, exit 1.
    gated = run_cli("diff", str(files / "rank0.json"), str(files / "rank2.json"), "--format", "html",
                    "--fail-above", "50%", cwd=tmp_path)
    assert gated.returncode == 1 and gated.stderr.startswith("Regressed above 50%")
    assert _embedded(gated.stdout)["threshold"] == 0.5
    ranks = [str(files / f"rank{r}.json") for r in range(4)]
    merged = run_cli("merge", *ranks, "-o", "m.html", cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    assert run_cli("merge", *ranks, "-o", "merged.json", cwd=tmp_path).returncode == 0
    shown = run_cli("show", "merged.json", "--format", "html", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (tmp_path / "m.html").read_text(encoding="utf-8") == hostile_run().render("html")


def test_cli_bench_writes_the_format_of_the_extension(tmp_path: Path) -> None:
    fast = ("zoo:mlp", "--batch-sizes", "1", "2", "--warmup", "1", "--min-runs", "2", "--min-time", "0")
    done = run_cli("bench", *fast, "-o", "b.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("zoo:mlp: ") and "samples/s" in done.stdout  # the table, as before
    data = _embedded((tmp_path / "b.html").read_text(encoding="utf-8"))
    assert [b["batch_size"] for b in data["batches"]] == [1, 2]
    as_json = run_cli("bench", *fast, "--format", "json", "--no-memory", cwd=tmp_path)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["schema"] == "layerscope-bench/1"


def test_cli_format_choices_come_from_the_registry(tmp_path: Path) -> None:
    for command in ("diff", "bench", "merge"):
        done = run_cli(command, "--help", cwd=tmp_path)
        assert "html" in done.stdout.split("--format", 1)[1].split("\n", 1)[0], command


# -- a failed write: the same exit status as every command ------------------------------


@pytest.mark.parametrize(
    "args", [
        ("diff", "{files}/rank0.json", "{files}/rank2.json"),
        ("merge", "{files}/rank0.json", "{files}/rank1.json"),
        ("show", "{files}/rank0.json"),
    ], ids=["diff", "merge", "show"],
)
@pytest.mark.parametrize("name", ["out.html", "out.json"])
def test_a_failed_write_is_exit_4_and_keeps_the_old_file(
    args: tuple[str, ...], name: str, files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from layerscope.cli import main

    target = tmp_path / name
    target.write_text("the old one\n", encoding="utf-8")

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(layerscope.base.io.os, "fsync", full_disk)
    status = main([arg.format(files=files) for arg in args] + ["-o", str(target)])
    assert status == 4
    assert capsys.readouterr().err == f"layerscope: error: cannot write {str(target)!r}: No space left on device\n"
    assert target.read_text(encoding="utf-8") == "the old one\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize(
    "args", [
        ("diff", "{files}/rank0.json", "{files}/rank2.json"),
        ("merge", "{files}/rank0.json", "{files}/rank1.json"),
        ("show", "{files}/rank0.json"),
        ("bench", "zoo:mlp", "--batch-sizes", "1"),
    ], ids=["diff", "merge", "show", "bench"],
)
def test_an_unwritable_folder_is_refused_before_any_work_as_a_usage_error(
    args: tuple[str, ...], files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from layerscope.cli import main

    status = main([arg.format(files=files) for arg in args] + ["-o", "/nonexistent-dir/out.html"])
    assert status == 2
    assert capsys.readouterr().err.startswith("layerscope: error: cannot write '/nonexistent-dir/out.html'")


# -- in a browser ---------------------------------------------------------------------


@pytest.fixture
def open_page(open_html: Any, tmp_path: Path) -> Any:  # noqa: F811
    def open_(text: str, name: str) -> Page:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return open_html(path)

    return open_


def _no_markup(page: Any) -> None:
    counts = page.evaluate(
        "() => ({img: document.querySelectorAll('img').length, b: document.querySelectorAll('b').length,"
        " scripts: document.querySelectorAll('script').length})"
    )
    assert counts == {"img": 0, "b": 0, "scripts": 2}


@pytest.mark.browser
def test_the_diff_page_shows_the_diffs_figures(open_page: Any) -> None:
    diff = hostile_diff()
    page = open_page(diff.render("html"), "diff.html").page
    change = page.get_attribute('#diff-summary tr[data-metric="time_ns"] td[data-key="change"]', "data-value")
    assert int(change) == diff.summary["time_ns"].delta == 500_000
    assert page.text_content('#diff-summary tr[data-metric="time_ns"] td[data-key="change"]') == "+500.0us"
    # The hostile module is a regression: highlighted, and its name is text.
    row = f'#diff-modules tr[data-path="{XSS_NAME}"]'
    assert "regression" in page.get_attribute(row, "class")
    assert page.text_content(f'{row} td[data-key="path"]') == XSS_NAME
    assert int(page.get_attribute(f'{row} td[data-key="self_time_ns:delta"]', "data-value")) == 15 * MS
    _no_markup(page)
    # Sorting by a column orders the rows by its raw values.
    page.click('#diff-modules th[data-key="self_time_ns:new"]')
    values = page.eval_on_selector_all('#diff-modules td[data-key="self_time_ns:new"]', "cells => cells.map(c => Number(c.dataset.value))")
    assert values == sorted(values, reverse=True)


@pytest.mark.browser
def test_the_ranks_page_shows_the_runs_figures(open_page: Any) -> None:
    run = hostile_run()
    page = open_page(run.render("html"), "ranks.html").page
    cell = f'#heatmap tr[data-path="{XSS_NAME}"][data-phase="forward"] td[data-rank="2"]'
    assert int(page.get_attribute(cell, "data-value")) == dict((r, v) for v, r in run.values_by_rank(XSS_NAME, "forward", "time_ns"))[2]
    assert page.text_content(cell) == "20.00ms"
    assert "hsl(0," in page.get_attribute(cell, "style")  # above the row's median: red
    assert page.text_content(f'#heatmap tr[data-path="{XSS_NAME}"] td.name') == XSS_NAME
    page.click('button[data-metric="self"]')
    assert page.get_attribute("#heatmap", "data-metric") == "self"
    top = run.stragglers()[0]
    assert page.get_attribute("#stragglers tbody tr", "data-path") == top.path == XSS_NAME
    assert int(page.get_attribute('#stragglers tbody tr td[data-key="excess"]', "data-value")) == top.excess_ns
    waits = page.eval_on_selector_all('#waiting td[data-key="wait"]', "cells => cells.map(c => Number(c.dataset.value))")
    assert waits == [w.wait_ns for w in run.waiting()]
    _no_markup(page)


@pytest.mark.browser
def test_the_bench_page_shows_the_results_figures(open_page: Any) -> None:
    result = bench_result()
    page = open_page(result.render("html"), "bench.html").page
    p50 = page.get_attribute('#bench-table tr[data-batch="8"] td[data-key="p50"]', "data-value")
    assert float(p50) == result.batch(8).p50_ns
    points = page.eval_on_selector_all("#latency-chart g.point", "gs => gs.map(g => Number(g.dataset.value))")
    assert points == [result.batch(1).p50_ns, result.batch(8).p50_ns]
    assert page.eval_on_selector_all("#memory-chart g.point", "gs => gs.length") == 2
    assert page.eval_on_selector_all("#throughput-chart g.point", "gs => gs.length") == 2
    assert page.text_content("h1 span") == "<b>mlp</b>"
    _no_markup(page)
