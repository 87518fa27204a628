"""Progress bars while passes run: the one seam between the ``progress(stage, done,
total)`` callback of :func:`layerscope.profile` and :func:`layerscope.benchmark` and a
screen, for the CLI and for a notebook alike.

rich draws the bar. On a terminal it is a live display on stderr, gone when the block
ends (the CLI shows it only when stderr is a terminal). In a Jupyter kernel (rich's
``Console.is_jupyter``) rich's live display needs ipywidgets and a front end running
them, and leaves nothing in a saved or exported notebook. There the same bar is drawn
into one output as HTML and text, updated in place through IPython's display handles
(``update_display_data``): any front end shows it, without ipywidgets, and the saved
notebook keeps its last state. The library itself never shows one unasked: a bar is
there only inside a ``progress_bar()`` block, with its callback passed on.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

#: ``report(stage, done, total)``: ``layerscope.profile``'s and ``layerscope.benchmark``'s
#: ``progress`` callback.
Report = Callable[[str, int, int], None]

#: What each stage is called on its bar (others keep their own name: "batch sizes").
STAGE_LABELS = {"warmup": "warm-up", "measure": "measuring"}

#: A notebook's bar is redrawn at most this often (each redraw is a message to the front
#: end), and always at the end of a stage and of the block.
NOTEBOOK_REDRAW_S = 0.1
#: The width the notebook's bar is drawn at, in characters.
NOTEBOOK_WIDTH = 100


@contextmanager
def progress_bar(console: Console | None = None) -> Iterator[Report]:
    """Show a bar per stage while the block runs; yields the callback to pass on::

        from layerscope.progress import progress_bar

        with progress_bar() as report:
            prof = layerscope.profile(model, x, progress=report)

    ``console`` is rich's console to draw on; by default stderr's, which knows whether it
    runs in a terminal or in a Jupyter kernel."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = console or Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console, transient=True,
    )
    if not console.is_jupyter:
        with progress:
            yield StageBars(progress)
        return
    bars = NotebookBars(progress)
    try:
        yield bars
    finally:
        bars.redraw()


class StageBars:
    """The callback: one bar per stage, in rich's ``Progress``, which draws them."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(STAGE_LABELS.get(stage, stage), total=total)
        self.progress.update(self.tasks[stage], completed=done)


class NotebookBars(StageBars):
    """The bars drawn into one notebook output, redrawn in place as stages advance."""

    def __init__(self, progress: Progress) -> None:
        from IPython.display import DisplayHandle

        super().__init__(progress)
        self.handle = DisplayHandle()
        self.handle.display(snapshot(progress))
        self.drawn_at = time.monotonic()

    def __call__(self, stage: str, done: int, total: int) -> None:
        super().__call__(stage, done, total)
        if done >= total or time.monotonic() - self.drawn_at >= NOTEBOOK_REDRAW_S:
            self.redraw()

    def redraw(self) -> None:
        self.handle.update(snapshot(self.progress))
        self.drawn_at = time.monotonic()


def snapshot(progress: Progress) -> Any:
    """The bars as they are now, as a display object with ``text/html`` (rich's own
    styles, inline) and ``text/plain``."""
    from rich.console import Console
    from rich.jupyter import JupyterRenderable

    console = Console(file=io.StringIO(), record=True, width=NOTEBOOK_WIDTH, color_system="truecolor", force_jupyter=False)
    console.print(progress.get_renderable())
    page = console.export_html(inline_styles=True, code_format=_PRE, clear=False)
    return JupyterRenderable(page, console.export_text())


# rich's own frame for its output in a notebook (rich.jupyter), with the code in it.
_PRE = (
    '<pre style="white-space:pre;overflow-x:auto;line-height:normal;'
    "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">{code}</pre>"
)
