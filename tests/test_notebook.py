"""Jupyter: a profile, a diff, a merged run and a benchmark show themselves in a notebook
as their interactive report in a sandboxed frame, with their text as the plain-text
fallback; progress bars draw in a kernel; and ``examples/quickstart.ipynb`` runs.

Without a kernel or a browser: each document's ``_repr_html_`` is one ``<iframe
sandbox="allow-scripts" srcdoc=...>`` holding exactly its page (hostile names included),
and the page is built only when a front end asks for HTML.

For real: the notebook is executed by nbclient in an ipykernel of this Python (a
kernelspec written into the test's folder names ``sys.executable``, so no kernel
installed elsewhere is picked up), rendered to HTML by nbconvert's own ``lab`` template,
and opened in headless chromium (conftest.py's ``browser`` fixture): every report frame
runs its script with no error, and the module tree expands inside the frame. nbclient,
ipykernel, nbformat and nbconvert come with the test extra.
"""

from __future__ import annotations

import io
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from layerscope.base import formats
from layerscope.progress import StageBars, progress_bar, snapshot
from layerscope.render.notebook import NOTEBOOK_FRAME_HEIGHT_PX
from test_pages import bench_result, hostile_diff, hostile_ranks, hostile_run

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"

#: The four document kinds with a report, built by hand with names that are markup.
DOCUMENTS = {
    "profile": lambda: hostile_ranks()[2],
    "diff": hostile_diff,
    "ranks": hostile_run,
    "bench": bench_result,
}

#: The quickstart's cells whose result is a document, and how its text begins.
DISPLAYED = {
    "layer-level-report": "FourConv  ·  cpu",
    "train": "FourConv  ·  cpu",
    "diff": "Diff  ·  base: FourConv",
    "bench": "FourConv: inference",
}


class _Tags(HTMLParser):
    """Every start tag of a piece of HTML, with its attributes unescaped."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _frame_attributes(markup: str) -> dict[str, str | None]:
    parser = _Tags()
    parser.feed(markup)
    parser.close()
    assert [tag for tag, _ in parser.tags] == ["iframe"], "the output is one frame and nothing else"
    return parser.tags[0][1]


# -- without a kernel ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", DOCUMENTS)
def test_each_document_shows_its_page_in_a_sandboxed_frame(kind: str) -> None:
    doc = DOCUMENTS[kind]()
    assert formats.document_kind(doc) == kind
    frame = doc._repr_html_()
    attributes = _frame_attributes(frame)
    # Scripts run, but in an opaque origin: no allow-same-origin, no popups, forms or
    # navigation of the notebook.
    assert attributes["sandbox"] == "allow-scripts"
    assert "width: 100%" in attributes["style"]
    assert f"height: {NOTEBOOK_FRAME_HEIGHT_PX}px" in attributes["style"]
    # srcdoc holds the page exactly, escaped: the only markup outside it is the frame's.
    assert attributes["srcdoc"] == doc.render("html")
    assert frame.count("<") == 2 and frame.endswith("></iframe>")
    assert frame == doc._repr_html_()  # deterministic, like the page
    # The plain-text fallback is the text rendering, what print() shows; repr() stays.
    assert doc._repr_mimebundle_() == {"text/plain": str(doc)}
    assert repr(doc).startswith(type(doc).__name__ + "(")


def test_one_notebook_frame_is_registered_by_the_renderers() -> None:
    # The model reaches the frame through the registry (render/notebook.py fills it), as
    # render() and save() reach the renderers; a second frame is refused.
    with pytest.raises(ValueError, match="a notebook frame is already registered"):
        formats.register_notebook_frame(lambda page: page)


def test_the_page_is_built_only_when_a_front_end_shows_html(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is rendered when a document is made; IPython's terminal (text only) never
    builds the page, a notebook builds it once; the document is left as it was."""
    display = pytest.importorskip("IPython.core.formatters")
    built: list[str] = []
    render = formats.render

    def counting(doc: Any, fmt: str = "text", **options: Any) -> Any:
        built.append(fmt)
        return render(doc, fmt, **options)

    monkeypatch.setattr(formats, "render", counting)
    profile = hostile_ranks()[0]
    before = profile.to_dict()
    assert built == []

    terminal = display.DisplayFormatter()
    terminal.active_types = ["text/plain"]
    data, _ = terminal.format(profile)
    assert data == {"text/plain": str(profile)}
    assert "html" not in built

    data, _ = display.DisplayFormatter().format(profile)
    assert built.count("html") == 1
    assert data["text/html"] == profile._repr_html_()
    assert data["text/plain"] == str(profile)
    assert profile.to_dict() == before


def test_a_terminal_shows_a_bar_per_stage() -> None:
    from rich.console import Console

    out = io.StringIO()
    with progress_bar(Console(file=out, force_terminal=True, width=80, color_system=None)) as report:
        for done in (1, 2):
            report("warmup", done, 2)
        for done in range(1, 6):
            report("measure", done, 5)
    drawn = out.getvalue()
    assert "warm-up" in drawn and "2/2" in drawn
    assert "measuring" in drawn and "5/5" in drawn


def test_a_notebooks_bar_is_html_and_text() -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    report = StageBars(progress)
    report("measure", 1, 1)
    report("batch sizes", 1, 3)
    shown = snapshot(progress)._repr_mimebundle_([], [])
    assert re.search(r"measuring +━+ 1/1", shown["text/plain"])
    assert re.search(r"batch sizes +━+╺?━* 1/3", shown["text/plain"])
    assert shown["text/html"].startswith("<pre") and "1/3" in shown["text/html"]


# -- the quickstart notebook, in a real kernel ----------------------------------------------


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """examples/quickstart.ipynb run top to bottom in an ipykernel of this Python, with a
    last cell added that prints the kernel's interpreter."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    kernelspec = pytest.importorskip("ipykernel.kernelspec")
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    folder = tmp_path_factory.mktemp("notebook")
    # A kernelspec of our own, in the test's folder: its argv names sys.executable.
    kernelspec.write_kernel_spec(folder / "kernels" / "layerscope-test")
    notebook = nbformat.read(QUICKSTART, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))
    with pytest.MonkeyPatch.context() as env:
        # The kernel's history and connection files stay in the test's folder.
        env.setenv("IPYTHONDIR", str(folder / "ipython"))
        env.setenv("JUPYTER_RUNTIME_DIR", str(folder / "runtime"))
        manager = AsyncKernelManager(
            kernel_name="layerscope-test", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder / "kernels")])
        )
        nbclient.NotebookClient(notebook, km=manager, timeout=300, resources={"metadata": {"path": str(folder)}}).execute()
    return notebook


def _cell(notebook: Any, cell_id: str) -> Any:
    return next(cell for cell in notebook.cells if cell.get("id") == cell_id)


def test_the_quickstart_is_stored_without_outputs() -> None:
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(QUICKSTART, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert set(DISPLAYED) <= {cell.get("id") for cell in code}


@pytest.mark.slow
def test_the_quickstart_runs_in_this_pythons_kernel(executed: Any) -> None:
    assert executed.cells[-1].outputs[0]["text"].strip() == sys.executable
    outputs = [output for cell in executed.cells if cell.cell_type == "code" for output in cell.outputs]
    assert [o for o in outputs if o.output_type == "error"] == []
    # Nothing on stderr: no warning (rich's "install ipywidgets" among them).
    assert [o["text"] for o in outputs if o.output_type == "stream" and o["name"] == "stderr"] == []
    for cell_id, text in DISPLAYED.items():
        [result] = [o for o in _cell(executed, cell_id).outputs if o.output_type == "execute_result"]
        assert result["data"]["text/plain"].startswith(text), cell_id
        assert _frame_attributes(result["data"]["text/html"])["sandbox"] == "allow-scripts", cell_id


@pytest.mark.slow
def test_the_quickstarts_progress_bars_end_full(executed: Any) -> None:
    """The bars are one output each, updated in place: the saved notebook holds the last
    state, every stage done."""
    for cell_id, stages in {"model-level": ["warm-up", "measuring"], "bench": ["batch sizes"]}.items():
        [bars] = [o for o in _cell(executed, cell_id).outputs if o.output_type == "display_data"]
        text = bars["data"]["text/plain"]
        assert [line.split()[0] for line in text.splitlines()] == [stage.split()[0] for stage in stages], cell_id
        for line in text.splitlines():
            done, total = re.search(r"(\d+)/(\d+)\s*$", line).groups()
            assert done == total, line
        assert bars["data"]["text/html"].startswith("<pre")


@pytest.mark.browser
def test_the_exported_quickstart_shows_working_reports(executed: Any, browser: Any, tmp_path: Path) -> None:
    nbconvert = pytest.importorskip("nbconvert")
    page_html, _ = nbconvert.HTMLExporter(template_name="lab").from_notebook_node(executed)
    path = tmp_path / "quickstart.html"
    path.write_text(page_html, encoding="utf-8")

    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[tuple[str, str]] = []
    blocked: list[str] = []
    page.on("console", lambda m: errors.append((m.text, m.location.get("url", ""))) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append((str(e), "")))

    # Offline: nothing outside the file is fetched. nbconvert's lab template loads
    # require.js and MathJax from a CDN for the notebook page itself (the reports need
    # neither and load nothing); those two fail to load, and their "Failed to load
    # resource" lines, from the notebook page, are the only messages let through.
    def offline(route: Any) -> None:
        if route.request.url.startswith(("file:", "data:", "about:")):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.route("**/*", offline)
    try:
        page.goto(path.as_uri())
        frames = page.locator("iframe.layerscope-report")
        assert frames.count() == len(DISPLAYED)
        reports = [frames.nth(i).element_handle().content_frame() for i in range(len(DISPLAYED))]
        for report in reports:
            report.locator("body[data-ready]").wait_for(timeout=15_000)
        # The first is the profile's: expanding "features" shows its first convolution.
        profile = reports[0]
        child = profile.locator('#tree-table tr[data-path="features.0"]')
        assert child.count() == 0 or not child.is_visible()
        profile.locator('#tree-table tr[data-path="features"] button.toggle').click()
        child.wait_for(state="visible", timeout=5_000)
        assert child.locator("td").nth(1).inner_text() == "Conv2d"
        # The training step's report has the step's parts beside the model.
        assert reports[1].locator('#tree-table tr[data-path="<loss>"]').count() == 1
        # The sandbox holds: the report runs in an opaque origin and cannot reach the notebook.
        reached = "() => { try { return window.parent.document.title } catch (e) { return 'blocked' } }"
        assert profile.evaluate("() => window.origin") == "null"
        assert profile.evaluate(reached) == "blocked"
        assert {url for _, url in errors} <= set(blocked)
        assert all(text.startswith("Failed to load resource") for text, _ in errors), errors
        assert all(url.startswith("https://cdnjs.cloudflare.com/") for url in blocked), blocked

        # The listeners hear the report frames too: a console error and an uncaught
        # exception raised inside a frame are both collected.
        before = len(errors)
        profile.evaluate("() => { console.error('probe'); setTimeout(() => { throw new Error('thrown probe') }) }")
        page.wait_for_timeout(500)
        heard = [text for text, _ in errors[before:]]
        assert "probe" in heard and any("thrown probe" in text for text in heard), heard
    finally:
        page.close()


def test_a_profiler_block_displays_its_profile_and_says_why_before_it_has_one() -> None:
    import torch

    import layerscope

    model = torch.nn.Linear(4, 2)
    prof = layerscope.Profiler(model)
    assert prof._repr_html_() is None  # no page to show yet
    assert "not started" in prof._repr_mimebundle_()["text/plain"]
    with prof:
        model(torch.randn(3, 4))
        assert "still running" in prof._repr_mimebundle_()["text/plain"]
    assert prof._repr_html_() == prof.profile._repr_html_()
    assert prof._repr_mimebundle_() == {"text/plain": str(prof.profile)}
