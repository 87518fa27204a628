"""The ``layerscope`` command line. The only place, with ``Profile.show``, that prints."""

from __future__ import annotations

import argparse
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from layerscope.base.errors import LayerscopeError, LayerscopeWarning, MissingDependencyError

DEMO_SPEC = "zoo:resnet18"

EPILOG = """\
SPEC is one of:
  zoo:NAME                   a built-in model (layerscope zoo lists them)
  transformers:ClassName     a transformers model from its default config, random weights,
                             with the inputs its config says it needs
  package.module:callable    a callable returning an nn.Module
  path/to/file.py:callable   the same, from a file

examples:
  layerscope demo
  layerscope profile zoo:alexnet --depth 2
  layerscope profile zoo:gpt --show-ops --depth 1
  layerscope profile transformers:BertModel --repeat 3 -o bert.json
  layerscope profile mymodels.py:build --input 8x3x224x224 --device cuda
  layerscope profile mymodels.py:build --inputs mymodels.py:sample_batch
  layerscope profile zoo:resnet18 --format model
  layerscope profile zoo:gpt --backward --depth 2     # forward and backward, the model in eval()
  layerscope profile zoo:gpt --train --depth 2        # training steps as they train: train(), AdamW
  layerscope flops zoo:vit_b_16 --depth 2
"""


PLOT_MEMORY_EPILOG = """\
examples:
  layerscope profile zoo:gpt --backward --repeat 1 -o gpt.json
  layerscope plot-memory gpt.json -o gpt_memory.png
  layerscope plot-memory run.json -o memory.png --title "GPT-2 training step"

In Python: prof.save("run.json") after a layerscope.Profiler(model) block around a
training step, or layerscope.render.plot.plot_memory(profile, "memory.png") directly.
Profiles made with memory=False or record_ops=False have no timeline to draw.
"""


DIFF_DESCRIPTION = """\
Compare two profiles saved as JSON, module by module and op by op: time, self time,
FLOPs and memory in BASE and NEW and the change, largest change in --metric first
(default: self device time where both have one, else self CPU time). With --fail-above
it gates CI: exit 1 when the model or a module grew by more than the threshold in it.
"""

DIFF_EPILOG = """\
examples:
  layerscope profile zoo:mlp -o base.json                  # before the change
  layerscope profile zoo:mlp -o new.json                   # after it
  layerscope diff base.json new.json                       # what moved, largest first
  layerscope diff base.json new.json --fail-above 10%      # exit 1 if over 10% slower
  layerscope diff base.json new.json --fail-above 0.1 --min-time 200us --limit 10
  layerscope diff base.json new.json --metric total_cpu --fail-above 10%   # gate on total time
  layerscope diff base.json new.json --format json -o diff.json
  layerscope diff run/layerscope_steps0-4_rank0.json run/layerscope_steps0-4_rank3.json
  layerscope diff merged.json --ranks 0 3                  # two ranks of a merged run
  layerscope diff merged_before.json merged_after.json     # two merged runs

Two merged runs (layerscope merge) compare their median ranks' trees, then how each
node's imbalance over the ranks (max / median time) moved. A merged run and --ranks A B
compares its rank A (base) with its rank B (new); two rank files compare as profiles.
Modules, labels and step parts are matched by path; ops by (module, phase, name,
input shapes). Rows only in NEW are marked added, rows only in BASE removed.

exit status:
  0  nothing regressed above --fail-above (or no --fail-above given)
  1  something did, in --metric: the model's figure (for a CPU time, the step's or
     the forward's time), or a module's in one phase (a time: at least --min-time in
     BASE or NEW); named after the table with its phase and metric
  2  bad input: a missing or damaged file, not a layerscope profile, a bad option
  4  the report could not be written (to -o's file, or to stdout)

In Python: layerscope.diff(layerscope.load("base.json"), layerscope.load("new.json"))
and its .regressions(0.1).
"""


#: Commands whose exceptions come from the user's model (exit 1).
_RUNS_A_MODEL = frozenset({"profile", "flops", "demo", "bench"})


#: Exit status when the output could not be written (a full disk, a closed pipe); 1 is a
#: model that raised (or, for diff and bench --compare, a regression), 2 bad input, 3 a bug.
EXIT_WRITE_FAILED = 4


class UsageError(LayerscopeError):
    """Bad command-line use: exit status 2."""


class OutputError(Exception):
    """Writing the output failed: exit status 4, one line naming where and the OS error."""

    def __init__(self, destination: str, error: OSError) -> None:
        super().__init__(destination, error)
        self.destination = destination
        self.error = error

    def __str__(self) -> str:
        return f"cannot write {self.destination}: {self.error.strerror or self.error}"


def _print(text: str | bytes) -> None:
    """Write ``text`` to stdout and flush it now, so that a full disk or a closed pipe
    is an :class:`OutputError` here, not a lost write at exit. A picture (a binary
    format's bytes) is refused: it belongs in a file."""
    if isinstance(text, bytes):
        raise UsageError("that format is a picture (PNG): write it to a file with -o NAME.png")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        raise OutputError("stdout", exc) from exc


def _write_file(path: str, write: Callable[[], Any], what: str) -> None:
    """Run ``write()``, which writes ``path``; then say on stderr where ``what`` went.
    Ctrl-C while it writes unwinds as usual, so the atomic write removes its temporary
    file and the old one is kept."""
    global _writing
    _writing = True
    try:
        write()
    except OSError as exc:
        raise OutputError(repr(path), exc) from exc
    finally:
        _writing = False
    print(f"layerscope: wrote {what} to {path}", file=sys.stderr)


#: Whether a file is being written (Ctrl-C then unwinds instead of exiting at once).
_writing = False


def _on_interrupt(signum: int, frame: Any) -> None:
    """Ctrl-C: one line and exit 130 at once. Unwinding a run stops torch's profiler
    with its ranges open, which takes seconds and prints torch's own warnings; nothing
    of the user's needs it (the command built its own model, and no file is written
    yet). While a file is written, the usual KeyboardInterrupt unwinds instead."""
    import os

    if _writing:
        raise KeyboardInterrupt
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    sys.stderr.write("layerscope: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


@contextmanager
def _interrupts_exit() -> Iterator[None]:
    """:func:`_on_interrupt` as the SIGINT handler while a command runs (in the main
    thread only: another thread cannot set one), the old handler back after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _drop_stdout() -> None:
    """After a failed write to stdout, point it at the null device, so that the
    interpreter's flush at exit does not fail again (and turn the exit status into 120)."""
    import os

    try:
        stdout_fd = sys.stdout.fileno()
        null_fd = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to drop
        return
    os.dup2(null_fd, stdout_fd)
    os.close(null_fd)


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {value}")
    return value


def _positive(text: str) -> int:
    """A count that may be zero: --warmup, --depth, --limit."""
    return _whole(text, 0)


def _at_least_one(text: str) -> int:
    """A count that must be one or more: --repeat, --batch-size, --min-runs."""
    return _whole(text, 1)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text}")
    return value


def _add_run_options(
    parser: argparse.ArgumentParser, *, spec: bool, timed: bool = True, defaults: dict[str, Any] | None = None
) -> None:
    if spec:
        parser.add_argument("spec", metavar="SPEC", help="the model to profile (see below)")
    parser.add_argument(
        "--input", action="append", default=[], metavar="SHAPE",
        help="a random input tensor of this shape, e.g. 1x3x224x224 or 8x128:int64 (integers are "
        "drawn below the model's vocabulary); repeat for several positional inputs",
    )
    parser.add_argument("--inputs", metavar="SPEC", help="a callable returning the inputs (Tensor, tuple or dict)")
    if spec:
        _add_config(parser)
    parser.add_argument("--batch-size", type=_at_least_one, default=1, help="batch size of a built-in model's default input (default 1)")
    parser.add_argument("--dtype", help="cast the model and its float inputs (float32, bfloat16, float16, ...)")
    parser.add_argument(
        "--autocast", metavar="DTYPE",
        help="run the passes under torch.autocast with this dtype (bfloat16, float16); the header says so",
    )
    if timed:
        parser.add_argument("--device", default="cpu", help="run on this device: cpu, cuda, cuda:1 (default cpu)")
        parser.add_argument("--warmup", type=_positive, default=2, help="unmeasured passes first (default 2)")
        parser.add_argument("--repeat", type=_at_least_one, default=5, help="measured passes; medians are reported (default 5)")
        parser.add_argument("--no-ops", action="store_true", help="time the passes by module hooks alone, the leanest: no aten ops, shapes, FLOPs or memory")
        parser.add_argument(
            "--with-stack", action="store_true",
            help="keep each op's Python call site (for --format ops --group-by stack:N)",
        )
        parser.add_argument(
            "--compile", action="store_true",
            help="profile torch.compile(model) (Inductor): per-module time from its kernels (with --backward, a "
            "training step's forward and backward kernels), FLOPs from the eager module; compile time and graph "
            "breaks reported apart (--format kernels lists the kernels)",
        )
        _add_peak_tflops(parser)
    else:
        parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, or meta to count without allocating (default cpu)")
    parser.add_argument(
        "--backward", action="store_true",
        help="run backward too (loss: sum of the first float output), the model in eval() mode as for "
        "inference (dropout off, BatchNorm's running statistics): forward and backward per module"
        + ("; --train for a training step as it trains" if timed else ""),
    )
    if timed:
        train = parser.add_argument_group("a training step (--train)")
        train.add_argument(
            "--train", action="store_true",
            help="profile whole training steps as they train: the model in train() mode, zero_grad, forward, "
            "loss, backward and the optimizer's step; --warmup steps first, then --repeat steps recorded in "
            "a block and summed",
        )
        train.add_argument("--optimizer", choices=("adamw", "adam", "sgd"), help="with --train (default adamw)")
        train.add_argument("--lr", type=float, help="with --train: the optimizer's learning rate (default 1e-4)")
        train.add_argument(
            "--loss", choices=("auto", "sum", "mean", "cross_entropy"),
            help="with --train: auto (default) is the model's own loss where it computes one from labels "
            "(a transformers language-model or classification head), else the sum of the first float output; "
            "cross_entropy takes its last dimension as classes",
        )
    parser.add_argument(
        "--no-memory", action="store_true",
        help="do not track memory (allocations, peaks, activations per module; the step's peak)",
    )
    parser.add_argument("--paths", nargs="+", metavar="PATH", help="profile only these named_modules() subtrees")
    _add_output_options(parser, ("profile",), defaults=defaults)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", metavar="KEY=VALUE,...",
        help="a transformers: model at the size you want (for a trace: the size it was recorded at): fields "
        "of its default config, e.g. num_hidden_layers=2,hidden_size=256,num_attention_heads=4",
    )


def _config(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--config``, parsed (None without it)."""
    from layerscope.zoo.specs import parse_config

    text = getattr(args, "config", None)
    return parse_config(text) if text else None


def _add_peak_tflops(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--peak-tflops", type=float, metavar="TFLOPS",
        help="the hardware's peak TFLOP/s, to show MFU (%% of peak); known automatically for common GPUs "
        "(a trace's from the GPU it names and the dtype its matrix ops ran in)",
    )


def _peak_tflops(args: argparse.Namespace) -> float | None:
    """``--peak-tflops``, checked by the library's own rule before any run or load."""
    peak = getattr(args, "peak_tflops", None)
    if peak is None:
        return None
    from layerscope.base.peaks import check_peak_tflops

    try:
        return check_peak_tflops(peak)
    except ValueError as exc:
        raise UsageError(str(exc).replace("peak_tflops", "--peak-tflops", 1)) from None


def _add_output_options(
    parser: argparse.ArgumentParser, documents: Sequence[str], *, defaults: dict[str, Any] | None = None,
    format_help: str = "output format (default: from -o's extension, else text)",
    output_help: str = "write to FILE (atomically) instead of stdout",
) -> None:
    """``--format``, ``-o`` and a flag per option of the formats of ``documents``, all
    from the output registry. ``defaults`` are this command's own defaults for options,
    applied when the chosen format takes them."""
    from layerscope.base.formats import renderers

    tables = [renderers(document) for document in documents]
    names = list(dict.fromkeys(r.name for table in tables for r in table))
    parser.add_argument("--format", choices=names, help=format_help)
    parser.add_argument("-o", "--output", metavar="FILE", help=output_help)
    takers: dict[str, list[str]] = {}
    options: dict[str, Any] = {}
    for table in tables:
        for renderer in table:
            for option in renderer.options:
                if option.flag:
                    options.setdefault(option.name, option)
                    label = renderer.name if renderer.document == documents[0] else f"{renderer.name} ({renderer.document})"
                    takers.setdefault(option.name, []).append(label)
    group = parser.add_argument_group("format options (each for the formats named after it)")
    defaults = defaults or {}
    for name, option in options.items():
        default = f"; default {defaults[name]}" if name in defaults else ""
        help_text = f"{option.help} [{', '.join(dict.fromkeys(takers[name]))}{default}]".replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": name, "default": None, "help": help_text}
        if option.parse is None:
            kwargs["action"] = "store_true"
        elif option.listing is not None:
            kwargs.update(action=_ListingAction, metavar=option.metavar, listing=option.listing, parse=option.parse)
        else:
            kwargs.update(type=_flag_type(option.parse), metavar=option.metavar, choices=option.choices)
        group.add_argument(option.flag_name, **kwargs)
    parser.set_defaults(format_defaults=defaults)


def _flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option's parser as argparse's ``type``: its ValueError becomes the message."""

    def parsed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parsed


class _ListingAction(argparse.Action):
    """A flag whose value ``list`` prints the accepted values and exits, as --help does
    (no SPEC needed); any other value is parsed."""

    def __init__(self, *args: Any, listing: Callable[[], str], parse: Callable[[str], Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listing = listing
        self.parse = parse

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        if values.strip() == "list":
            parser._print_message(self.listing(), sys.stdout)
            parser.exit()
        try:
            setattr(namespace, self.dest, self.parse(values))
        except ValueError as exc:
            parser.error(f"argument {option_string}: {exc}")


def _output_format(args: argparse.Namespace, document: str, default: str = "text", hint: str = "") -> str:
    """``--format``, else the format -o's extension names, else ``default``."""
    from layerscope.base.formats import DOCUMENTS, format_for_path, formats

    fmt = args.format or (format_for_path(args.output, default=default, document=document) if args.output else default)
    if fmt not in formats(document):
        raise UsageError(f"{DOCUMENTS[document]} has no format {fmt!r}; it has: {', '.join(formats(document))}{hint}")
    return fmt


def _format_options(args: argparse.Namespace, document: str, fmt: str, hint: str = "") -> dict[str, Any]:
    """The format options given on the command line (and this command's defaults for
    them), checked before any run: an option ``fmt`` does not take is a usage error
    naming the formats that do."""
    from layerscope.base.formats import DOCUMENTS, get_renderer, renderers

    takes = get_renderer(fmt, document).option_names()
    given = {name: getattr(args, name) for name in _command_flags(args) if getattr(args, name) is not None}
    wrong = [name for name in given if name not in takes]
    text = get_renderer("text", document).option_names() if fmt != "text" and "text" in _names(document) else set()
    if wrong and getattr(args, "output", None) and all(name in text for name in wrong):
        # -o FILE in another format, with options of the printed tree (--depth): write
        # the file and print the tree too, from the one run.
        args.print_text = {name: given.pop(name) for name in wrong}
        wrong = []
    if wrong:
        shown = ", ".join("--" + name.replace("_", "-") for name in wrong)
        takers = [r.name for r in renderers(document) if any(name in r.option_names() for name in wrong)]
        if not takers:
            raise UsageError(f"{shown}: not for {DOCUMENTS[document]}{hint}")
        raise UsageError(f"{shown}: only for --format {' or '.join(takers)} (the format here is {fmt}){hint}")
    defaults = {name: value for name, value in args.format_defaults.items() if name in takes and name not in given}
    return {**defaults, **given}


def _names(document: str) -> set[str]:
    """The formats of ``document``."""
    from layerscope.base.formats import renderers

    return {r.name for r in renderers(document)}


def _command_flags(args: argparse.Namespace) -> list[str]:
    """Every format option this command has a flag for (from any of its documents)."""
    from layerscope.base.formats import DOCUMENTS, renderers

    names = [o.name for document in DOCUMENTS for r in renderers(document) for o in r.options if o.flag]
    return [name for name in dict.fromkeys(names) if hasattr(args, name)]


class _Parser(argparse.ArgumentParser):
    """argparse, with errors in one line, and its messages (--help, --version) flushed
    and their write failures raised: argparse itself swallows an ``OSError`` there, and
    --help > a full disk would exit 0 with nothing written. Subcommands' parsers are of
    this class too."""

    def error(self, message: str) -> NoReturn:
        """One line, not argparse's usage block: the error and where to read more."""
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")

    def _print_message(self, message: str, file: Any = None) -> None:
        if not message:
            return
        stream = file or sys.stderr
        try:
            stream.write(message)
            stream.flush()
        except OSError as exc:
            if stream is sys.stdout:
                raise OutputError("stdout", exc) from exc


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="layerscope",
        description="Where do the time, memory and FLOPs of a PyTorch model go? "
        "Profiles a model layer by layer, forward and backward, and prints the module tree.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from layerscope.base.version import __version__

    parser.add_argument("--version", action="version", version=f"layerscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    prof = sub.add_parser(
        "profile", help="profile a model layer by layer: time, FLOPs, memory (--backward: the training step)", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run warm-up passes, then measured passes, and show the median pass whole: its module "
        "tree, op rows, FLOPs and memory, all from that one run.",
    )
    _add_run_options(prof, spec=True)

    demo = sub.add_parser(
        "demo", help=f"profile a built-in model ({DEMO_SPEC}) with no set-up",
        description=f"Profile the built-in {DEMO_SPEC} on a random 1x3x224x224 image.",
    )
    _add_run_options(demo, spec=False, defaults={"depth": 2})

    flops = sub.add_parser(
        "flops", help="count FLOPs, MACs and params in one pass, without timing",
        epilog=EPILOG + "  layerscope flops transformers:LlamaForCausalLM --device meta --depth 2\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Count FLOPs, MACs, bytes and params per module from one forward pass. "
        "With --device meta the model is built on the meta device and nothing is allocated, "
        "so models too large for this machine can be counted.",
    )
    _add_run_options(flops, spec=True, timed=False)

    sub.add_parser("zoo", help="list the built-in models", description="List the built-in models.")

    show = sub.add_parser(
        "show", help="re-render a saved profile in any format, without the model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Render a profile saved as JSON (profile -o x.json, Profile.save), or a torch.profiler\n"
        "trace, in any format, with the same options as profile; the user's model is never run (a trace\n"
        "without module events, read with --model, has its modules placed by one run of a meta copy).\n"
        "A merged run (layerscope merge -o) and a saved diff (layerscope diff -o d.json) are shown too.",
        epilog="examples:\n"
        "  layerscope show run.json --depth 2\n"
        "  layerscope show run.json --format ops --group-by shape --limit 20\n"
        "  layerscope show run.json -o run.trace.json        # Chrome trace / Perfetto\n"
        "  layerscope show run.json --format folded --metric flops\n"
        "  layerscope show merged.json                      # ranks merged by 'layerscope merge'\n"
        "  layerscope show merged.json --rank 3 --depth 2   # the tree of rank 3\n"
        "  layerscope show run.pt.trace.json.gz             # a torch.profiler trace, by module\n"
        "  layerscope show run.pt.trace.json.gz --no-shapes # times and memory only: fast, no torch\n"
        "  layerscope show run.pt.trace.json.gz --model transformers:BertModel\n"
        "  layerscope show run.pt.trace.json.gz --model transformers:BertModel --config hidden_size=512,num_hidden_layers=4\n",
    )
    show.add_argument(
        "profile", metavar="PROFILE",
        help="a profile saved as JSON, a merged run (layerscope merge), or a torch.profiler trace "
        "(.json or .json.gz, as Kineto writes it: see docs/traces.md)",
    )
    show.add_argument(
        "--rank", type=_positive, metavar="N",
        help="a merged run: render rank N's profile (any format) instead of the report of all ranks",
    )
    _add_output_options(show, ("profile", "ranks"))
    _add_trace_model(show)
    _add_peak_tflops(show)
    show.add_argument("--debug", action="store_true", help="show full tracebacks")

    plot = sub.add_parser(
        "plot-memory", help="draw a saved profile's memory timeline as a PNG (needs matplotlib)",
        epilog=PLOT_MEMORY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Draw the memory timeline of a profile saved as JSON, as a PNG:\n"
        "live bytes over one step, the baseline, the peak with the module and phase it\n"
        "happened in, the model's top-level modules and the step's parts (loss, optimizer)\n"
        "as bars, and what the peak is made of (parameters, gradients, optimizer state,\n"
        "activations, other). Needs matplotlib: pip install 'layerscope[plot]'.",
    )
    plot.add_argument("profile", metavar="PROFILE", help="a profile saved as JSON (profile -o x.json, Profile.save)")
    plot.add_argument("-o", "--output", metavar="OUT.png", required=True, help="the PNG to write (atomically)")
    plot.add_argument("--title", help="the picture's title (default: '<model> memory over one step')")
    plot.add_argument("--debug", action="store_true", help="show full tracebacks")

    compare = sub.add_parser(
        "diff", help="compare two saved profiles: what got slower, and where", description=DIFF_DESCRIPTION,
        epilog=DIFF_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compare.add_argument("base", metavar="BASE", help="the profile before the change (JSON), or a merged run")
    compare.add_argument("new", metavar="NEW", nargs="?", help="the profile after the change (JSON), or a merged run")
    compare.add_argument(
        "--ranks", nargs=2, type=_positive, metavar=("A", "B"),
        help="BASE is a merged run (layerscope merge) and NEW is not given: compare its rank A (as base) "
        "with its rank B (as new)",
    )
    compare.add_argument(
        "--fail-above", metavar="THRESHOLD",
        help="exit 1 if the model's figure or a module's, in one phase, grew by more than this in --metric: "
        "10%% or 0.1",
    )
    compare.add_argument(
        # Its own dest: the folded and speedscope formats have a --metric option of their own.
        "--metric", dest="diff_metric", metavar="METRIC",
        help="what orders the rows and what --fail-above gates: self_ or total_, then cpu, device, flops or "
        f"alloc ({_diff_metrics()}; default: self_device where both profiles have device time, else self_cpu)",
    )
    compare.add_argument(
        "--min-time", metavar="TIME",
        help="noise floor: ignore modules whose metric (a time) is below this in both profiles "
        "(50us, 1ms, 200ns; a bare number is ns; default 5us for a device time, else 50us)",
    )
    _add_output_options(compare, ("diff",), defaults={"limit": 20})
    _add_trace_model(compare)
    compare.add_argument("--debug", action="store_true", help="show full tracebacks")
    _add_merge_parser(sub)
    _add_bench_parser(sub)
    return parser



def _diff_metrics() -> str:
    from layerscope.model.diff import METRICS

    return ", ".join(METRICS)


def _add_trace_model(parser: Any) -> None:
    parser.add_argument(
        "--model", metavar="SPEC",
        help="for torch.profiler trace files: the model that was traced (zoo:NAME, transformers:NAME, "
        "module:callable or file.py:callable building it), to give the trace's modules (BertLayer_3) their paths and "
        "parameters; built on the meta device, never run; a model whose parameters' shapes the trace's "
        "ops were not given is refused. A trace recorded without with_stack has no module events: its "
        "ops are aligned to the model's calls, learned from one run of a meta copy of it with the model's "
        "default input or --input/--inputs (docs/traces.md)",
    )
    parser.add_argument(
        "--input", action="append", default=[], metavar="SHAPE",
        help="with --model, for a trace without module events: the shape the model was called with "
        "(8x128:int64; repeat for several positional inputs); only shapes and dtypes are read",
    )
    parser.add_argument(
        "--inputs", metavar="SPEC",
        help="with --model: a callable returning the inputs the model was called with (Tensor, tuple or dict)",
    )
    parser.add_argument(
        "--no-shapes", action="store_true",
        help="for torch.profiler trace files: read it as if it had recorded no shapes: the same "
        "times, no FLOPs, each op row the op where a module called it (aten::linear, not the addmm "
        "in it); faster, in less memory, and without importing torch (docs/traces.md)",
    )
    _add_config(parser)


MERGE_EPILOG = """\
examples:
  layerscope merge run/layerscope_steps0-4_rank*.json -o merged.json
  layerscope merge run/layerscope_steps0-4_rank*.json                 # the report on stdout
  layerscope show merged.json                                         # the report again
  layerscope show merged.json --rank 3 --depth 2                      # rank 3's tree
  layerscope diff merged.json --ranks 0 3                             # rank 0 against rank 3
  layerscope diff before.json after.json                              # two merged runs
  layerscope merge run/layerscope_steps0-4_rank*.json -o run.trace.json   # Perfetto, pid = rank
  layerscope merge merged_0-3.json merged_4-7.json -o merged.json     # merged runs merge again

The report: per node and phase, the time on every rank (or, beyond 8 ranks, the most
imbalanced nodes), its median, max and slowest rank, and max / median; the stragglers
(a rank whose self time in a node exceeds the other ranks' median by more than
--threshold and --min-time), largest excess first; each rank's waiting in collectives;
the ranks missing from the world size. Files of other runs (run_id), models, world sizes
or cycles (step ranges), or one rank given twice, are refused (exit 2).
"""


def _add_merge_parser(sub: Any) -> None:
    merge = sub.add_parser(
        "merge", help="merge the per-rank profiles of a distributed run: imbalance, stragglers, waiting",
        epilog=MERGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Merge the profiles a distributed job wrote, one per rank (one cycle: files of one\n"
        "step range), or merged runs of it, into one layerscope-ranks/1 document.",
    )
    merge.add_argument(
        "files", metavar="FILE", nargs="+", help="rank profiles (JSON), torch.profiler traces of the ranks, or merged runs"
    )
    _add_output_options(
        merge, ("ranks", "rank-traces"),
        format_help="json: the merged document; text: the report; html: an interactive page (heat map, "
        "stragglers, waiting); chrome: one Chrome trace with a process per rank, from the rank files' traces "
        "(default: from -o's extension: .trace.json chrome, .json json, .html html, else text)",
    )
    merge.add_argument(
        "--threshold", metavar="RATIO", default="10%",
        help="a straggler's self time exceeds the other ranks' median by more than this (default 10%%)",
    )
    merge.add_argument(
        "--min-time", metavar="TIME", default="1ms",
        help="... and by at least this much (1ms, 500us; a bare number is ns; default 1ms)",
    )
    merge.add_argument(
        "--jobs", "-j", metavar="N", type=_at_least_one, default=None,
        help="read up to N rank traces at once, each in a process of its own (default: one per core)",
    )
    _add_trace_model(merge)
    merge.add_argument("--debug", action="store_true", help="show full tracebacks")


BENCH_EPILOG = """\
examples:
  layerscope bench zoo:mlp --batch-sizes 1 8 32 -o mlp.json
  layerscope bench zoo:resnet18 --batch-sizes 1 2 4 8 --plot resnet18.png
  layerscope bench zoo:gpt --mode train --batch-sizes 1 4 --min-time 1
  layerscope bench mymodels.py:build --inputs mymodels.py:batch_of --device cuda --dtype bfloat16
  layerscope bench --compare base.json new.json --fail-above 10%

Batching: the sample (the model's default input, --input SHAPE, which must have a batch
dimension of 1 at dim 0, e.g. 1x3x224x224) is repeated along dim 0 to each batch size,
every tensor of a tuple or dict alike. --inputs SPEC names a callable taking the batch
size and returning the whole batch instead. Throughput is batch size / mean latency.
"""


def _add_bench_parser(sub: Any) -> None:
    bench = sub.add_parser(
        "bench", help="benchmark a whole model: latency, throughput and memory per batch size",
        epilog=EPILOG.split("examples:")[0] + BENCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Time a model's forward (or a training step) at several batch sizes after warm-up, "
        "until --min-runs runs and --min-time seconds: p50/p90/p99, mean ± std, throughput, peak "
        "memory, with its size, FLOPs and the machine. Or compare two saved runs (--compare).",
    )
    bench.add_argument("spec", metavar="SPEC", nargs="?", help="the model to benchmark (see below)")
    bench.add_argument("--compare", nargs=2, metavar=("BASE", "NEW"), help="compare two saved benchmarks instead")
    bench.add_argument("--fail-above", metavar="THRESHOLD", help="with --compare: exit 1 if a batch size got slower "
                       "by more than this (10%% or 0.1) and by more than the noise")
    bench.add_argument("--input", action="append", default=[], metavar="SHAPE", help="a random input of this shape, batch 1 first: 1x3x224x224")
    bench.add_argument("--inputs", metavar="SPEC", help="a callable taking the batch size, returning the batch")
    _add_config(bench)
    bench.add_argument("--batch-sizes", type=_at_least_one, nargs="+", default=[1, 8, 32], metavar="N", help="default: 1 8 32")
    bench.add_argument("--mode", choices=("inference", "train"), default="inference", help="inference (default) or a training step (SGD, on a copy)")
    bench.add_argument("--dtype", help="cast a copy of the model and the float inputs (float32, bfloat16, float16)")
    bench.add_argument("--autocast", metavar="DTYPE", help="run under torch.autocast with this dtype")
    bench.add_argument("--compile", action="store_true", help="torch.compile a copy; compile time reported apart")
    bench.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    bench.add_argument("--warmup", type=_positive, default=3, help="untimed runs per batch size first (default 3)")
    bench.add_argument("--min-runs", type=_at_least_one, default=10, help="at least this many timed runs (default 10)")
    bench.add_argument("--min-time", type=_seconds, default=0.5, metavar="SECONDS", help="and at least this much timed time (default 0.5)")
    bench.add_argument("--lr", type=float, default=1e-3, help="--mode train: SGD's learning rate (default 1e-3)")
    bench.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass (CPU)")
    bench.add_argument("--max-batch", action="store_true", help="CUDA: also search the largest batch size that fits")
    _add_output_options(
        bench, ("bench",), output_help="also write the result to FILE (atomically): JSON, or HTML for .html",
        format_help="-o's format (default: from its extension: .html html, .txt text, .png png, else json); "
        "without -o, stdout's (default text)",
    )
    bench.add_argument("--plot", metavar="OUT.png", help="draw latency and throughput against batch size (needs matplotlib)")
    bench.add_argument("--debug", action="store_true", help="show full tracebacks")


@contextmanager
def _progress_bar(enabled: bool) -> Iterator[Any]:
    """A progress bar on stderr while passes run, only when stderr is a terminal."""
    if not enabled:
        yield None
        return
    from layerscope.progress import progress_bar

    with progress_bar() as report:
        yield report


def _move(value: Any, device: Any, dtype: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_move(v, device, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _move(v, device, dtype) for k, v in value.items()}
    return value


def _emit(doc: Any, args: argparse.Namespace, fmt: str, options: dict[str, Any], what: str | None = None) -> int:
    """Write ``doc`` in ``fmt`` to ``-o`` (atomically, streamed) or stdout; on a terminal,
    a format with a ``width`` option fits it."""
    from layerscope.base.formats import document_kind, get_renderer, render, render_chunks, terminal_width
    from layerscope.base.io import write_atomic

    # The option that chose the format, for "show --format png needs matplotlib".
    asked = f"{args.command} --format {args.format}" if args.format else f"{args.command} -o {args.output}"
    with _needs_package(asked):
        if not args.output:
            width = terminal_width()
            if "width" in get_renderer(fmt, document_kind(doc)).option_names() and width is not None:
                options = {"width": width, **options}
            _print(render(doc, fmt, **options))
        else:
            output = args.output
            _write_file(output, lambda: write_atomic(output, render_chunks(doc, fmt, **options)), what or fmt)
            printed = getattr(args, "print_text", None)
            if printed is not None:  # the tree's options given beside -o: the tree printed too
                width = terminal_width()
                if "width" in get_renderer("text", document_kind(doc)).option_names() and width is not None:
                    printed = {"width": width, **printed}
                _print(render(doc, "text", **printed))
    return 0


@contextmanager
def _needs_package(asked: str) -> Iterator[None]:
    """A missing optional package, said of ``asked`` (the command and option the user
    gave), not of the library function that needed it."""
    try:
        yield
    except MissingDependencyError as exc:
        raise UsageError(f"{asked} needs {exc.package}: {exc.install}") from exc


def _show(args: argparse.Namespace) -> int:
    from layerscope.model.diff import ProfileDiff
    from layerscope.model.ranks import MergedRun

    peak = _peak_tflops(args)
    doc = _load_profile(args.profile, args, bar=True, diffs=True)
    document, hint = "profile", ""
    if isinstance(doc, ProfileDiff):
        document, hint = "diff", "; layerscope diff compares two profiles again with other options"
        if args.rank is not None or peak is not None:
            raise UsageError(f"--rank and --peak-tflops: {args.profile} is a saved diff{hint}")
    elif isinstance(doc, MergedRun):
        if args.rank is None:
            document, hint = "ranks", "; --rank N renders rank N's profile in any format"
        else:
            doc = _rank_of(doc, args.rank, args.profile)
    elif args.rank is not None:
        raise UsageError(f"--rank: {args.profile} is one rank's profile, not a merged run (layerscope merge)")
    if peak is not None:
        if document == "ranks":
            raise UsageError(f"--peak-tflops: MFU is per profile; {hint.removeprefix('; ')}")
        from layerscope.base.peaks import given_peak_flops_per_s

        doc.meta.peak_flops_per_s = given_peak_flops_per_s(peak)
        doc.meta.peak_from = f"given (--peak-tflops {peak:g})"
    fmt = _output_format(args, document, hint=hint)
    options = _format_options(args, document, fmt, hint)
    if args.output:
        _check_writable(args.output)
    return _emit(doc, args, fmt, options)


def _run_profile(args: argparse.Namespace, spec: str, *, count_only: bool = False) -> int:
    # What can be refused without torch is refused first: a misspelt SPEC, option or format.
    _check_specs(args, spec)
    _peak_tflops(args)
    if not count_only:
        _check_train_flags(args)
    fmt = _output_format(args, "profile")
    format_options = _format_options(args, "profile", fmt)
    if getattr(args, "compile", False) and fmt == "chrome":
        raise UsageError("a compiled model's profile keeps no trace; its kernels and their times: --format kernels")
    if args.output:
        _check_writable(args.output)  # before a run that may take minutes
    shapes = _input_shapes(args)

    import layerscope
    from layerscope.capture.modules import refuse_meta_timing
    from layerscope.zoo.specs import parse_dtype, resolve_inputs, resolve_model

    dtype, autocast = (parse_dtype(text) if text else None for text in (args.dtype, args.autocast))
    device = _device(args.device)

    if not count_only and device.type == "meta":
        raise UsageError("the meta device runs no kernels, so nothing can be timed; use 'layerscope flops'")
    amp = _autocast(device, autocast)

    # On the meta device the model is built there directly: a 7B model allocates nothing.
    resolved = resolve_model(
        spec, batch_size=args.batch_size, device=device if device.type == "meta" else None, config=_config(args)
    )
    inputs = _inputs_from(args, spec, shapes, resolved, resolve_inputs)
    if not count_only:
        refuse_meta_timing(resolved.model, inputs)  # a SPEC may build its model on meta itself

    model = resolved.model.eval().to(device)
    if dtype is not None:
        model = model.to(dtype)
    inputs = _move(inputs, device, dtype)
    if getattr(args, "compile", False):
        import torch

        model = torch.compile(model)

    if getattr(args, "train", False):
        return _emit(_train_profile(args, model, inputs, amp, resolved.label), args, fmt, format_options)
    with _hinted(model, inputs), amp:
        if count_only:
            prof = layerscope.count_flops(model, inputs, paths=args.paths, backward=args.backward, memory=not args.no_memory)
        else:
            with _progress_bar(sys.stderr.isatty()) as report:
                prof = layerscope.profile(
                    model, inputs, warmup=args.warmup, repeat=args.repeat,
                    paths=args.paths, record_ops=not args.no_ops, memory=not args.no_memory, progress=report,
                    peak_tflops=args.peak_tflops, backward=args.backward, with_stack=args.with_stack,
                )
    prof.meta.spec = resolved.label
    return _emit(prof, args, fmt, format_options)


def _train_profile(args: argparse.Namespace, model: Any, inputs: Any, amp: Any, label: str) -> Any:
    """``profile --train``: whole training steps in a block (``session.profile_training``)."""
    from layerscope.session import profile_training

    with _hinted(model, inputs), amp, _progress_bar(sys.stderr.isatty()) as report:
        prof = profile_training(
            model, inputs, optimizer=args.optimizer or "adamw", lr=1e-4 if args.lr is None else args.lr,
            loss=args.loss or "auto", warmup=args.warmup, steps=args.repeat, record_ops=not args.no_ops,
            memory=not args.no_memory, peak_tflops=args.peak_tflops, progress=report,
        )
    prof.meta.spec = label
    return prof


def _check_train_flags(args: argparse.Namespace) -> None:
    """``--optimizer``, ``--lr`` and ``--loss`` belong to ``--train``, which ``--backward``
    and ``--paths`` do not go with: refused before any run."""
    if not getattr(args, "train", False):
        given = [flag for flag, value in (("--optimizer", args.optimizer), ("--lr", args.lr), ("--loss", args.loss))
                 if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: for a training step; add --train")
        return
    if args.backward:
        raise UsageError("--train runs backward in each step already: drop --backward (which keeps eval() mode)")
    if args.paths:
        raise UsageError("--paths is for profile's passes; --train records whole steps of the whole model")
    if args.with_stack:
        raise UsageError("--with-stack is for profile's passes; --train records whole steps in a block")
    if args.lr is not None and not args.lr > 0:
        raise UsageError(f"--lr must be a learning rate > 0, got {args.lr:g}")


def _check_specs(args: argparse.Namespace, spec: str) -> None:
    """Refuse, before torch is imported, the model SPEC and ``--inputs`` SPEC that cannot
    be read (an unknown zoo name, a module or file that is not there) and an unknown
    ``--dtype`` or ``--autocast``."""
    from layerscope.zoo.specs import check_callable_spec, check_spec, dtype_name

    check_spec(spec, config=_config(args))
    if args.inputs:
        check_callable_spec(args.inputs, "inputs")
    for text in filter(None, (args.dtype, args.autocast)):
        dtype_name(text)


def _device(text: str) -> Any:
    """``--device`` as a ``torch.device`` that this torch can use."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(f"unknown device {text!r}; expected cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but this torch sees no CUDA device")
    return device


def _autocast(device: Any, dtype: Any) -> Any:
    """``torch.autocast`` on ``device`` with ``dtype`` (``--autocast``), or no context."""
    import contextlib

    import torch

    if dtype is None:
        return contextlib.nullcontext()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            context = torch.autocast(device.type, dtype=dtype)
        except RuntimeError as exc:  # no autocast on this device type (meta)
            raise UsageError(f"--autocast on {device.type}: {exc}") from None
    # torch warns and turns autocast off for a dtype it does not run on this device.
    refused = [str(w.message) for w in said if "autocast" in str(w.message).lower()]
    if refused:
        supported = re.findall(r"torch\.(\w+)", refused[0].split("supports", 1)[-1]) or ["bfloat16", "float16"]
        raise UsageError(
            f"--autocast {str(dtype).removeprefix('torch.')}: autocast on {device.type} runs "
            f"{' or '.join(supported)}; expected one of those"
        )
    return context


@contextmanager
def _hinted(model: Any, inputs: Any) -> Iterator[None]:
    """When a transformers model raises on the inputs it was given, add a note naming
    them and what its forward takes: its own error rarely says which input is missing."""
    from layerscope.zoo.specs import input_hint

    try:
        yield
    except LayerscopeError:
        raise
    except Exception as exc:
        hint = input_hint(model, inputs)
        if hint is not None:
            exc.add_note(hint)
        raise


def _input_shapes(args: argparse.Namespace) -> list[Any]:
    """The --input shapes, parsed; refused beside --inputs (one or the other)."""
    from layerscope.zoo.specs import parse_shape

    if args.input and args.inputs:
        raise UsageError("give either --input SHAPE or --inputs SPEC, not both")
    return [parse_shape(s) for s in args.input]


def _inputs_from(args: argparse.Namespace, spec: str, shapes: list[Any], resolved: Any, from_spec: Any) -> Any:
    """The inputs: ``from_spec(--inputs)``, random tensors of the --input shapes
    (integers below the model's vocabulary, so they are valid token ids), or the
    model's own default inputs."""
    import torch

    from layerscope.zoo.specs import DEFAULT_INT_LIMIT, tensor_for, vocab_size

    if args.inputs:
        return from_spec(args.inputs)
    if shapes:
        generator = torch.Generator().manual_seed(0)
        limit = vocab_size(resolved.model) or DEFAULT_INT_LIMIT
        return tuple(tensor_for(shape, dt, generator, int_limit=limit) for shape, dt in shapes)
    if resolved.inputs is not None:
        return resolved.inputs
    raise UsageError(f"{spec} comes with no default input; pass --input SHAPE or --inputs SPEC")


def _check_writable(path: str) -> None:
    """Refuse, before a run, an output that cannot be written: a missing or read-only
    folder, a folder given as the file. A device or FIFO is written in place, so it is
    the file itself that must be writable; through a symlink, its target's folder."""
    import os

    from layerscope.base.io import destination

    try:
        target, in_place = destination(path)
    except IsADirectoryError as exc:
        raise UsageError(str(exc)) from None
    if in_place:
        if not os.access(target, os.W_OK):
            raise UsageError(f"cannot write {path!r}: permission denied")
        return
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise UsageError(f"cannot write {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"cannot write {path!r}: folder {folder!r} is not writable")


def _load_profile(
    path: str, args: argparse.Namespace | None = None, *, bar: bool = False, diffs: bool = False,
) -> Any:
    """A saved profile, a merged run of ranks, or a torch.profiler trace (with ``--model
    SPEC`` mapping its modules), and with ``diffs`` a saved diff; a missing or unreadable
    file is a usage error (exit 2).
    ``bar``: a trace's read and build show a progress bar where stderr is a terminal (a
    large trace takes a while; worker processes show none)."""
    import os

    import layerscope
    from layerscope.base.kineto_json import is_kineto_trace
    from layerscope.loading import expect, is_trace_file
    from layerscope.model.diff import ProfileDiff
    from layerscope.model.ranks import MergedRun
    from layerscope.model.tree import Profile

    model = None
    if args is not None and getattr(args, "config", None) and not getattr(args, "model", None):
        raise UsageError("--config sizes the model --model SPEC names (a transformers: one); give --model too")
    inputs = None
    if args is not None and (getattr(args, "input", None) or getattr(args, "inputs", None)) and not getattr(args, "model", None):
        raise UsageError("--input and --inputs give the inputs of the model --model SPEC names; give --model too")
    if args is not None and getattr(args, "model", None) and os.path.isfile(path) and is_kineto_trace(path):
        model = _trace_model(args)
        inputs = _trace_inputs(args)
    elif args is not None and getattr(args, "model", None) and os.path.isfile(path):
        # A saved document knows its modules: a --model would be silently ignored.
        raise UsageError(
            f"--model names the model a torch.profiler trace was recorded with; {path} is not a trace "
            "(a saved document knows its modules): drop --model"
        )
    no_shapes = args is not None and getattr(args, "no_shapes", False)
    # Sniffed once (its first 64 KiB), only where a flag or a terminal asks.
    trace = (no_shapes or (bar and sys.stderr.isatty())) and os.path.isfile(path) and is_trace_file(path)
    if no_shapes and os.path.isfile(path) and not trace:
        raise UsageError(
            f"--no-shapes reads a torch.profiler trace file without its recorded shapes; {path} is a "
            "saved document, read whole (--columns and the formats choose what is shown)"
        )
    try:
        with _progress_bar(bar and sys.stderr.isatty() and trace) as report:
            doc = layerscope.load(path, model=model, shapes=not no_shapes, progress=report, inputs=inputs)
        if diffs:
            return expect(doc, repr(path), Profile, MergedRun, ProfileDiff)
        return expect(doc, repr(path), Profile, MergedRun)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:  # a folder, no permission
        raise UsageError(f"cannot read {path!r}: {exc.strerror or exc}") from exc


def _trace_model(args: argparse.Namespace) -> Any:
    """The model ``--model SPEC`` names, built once, on the meta device (its structure and
    parameter counts are all a trace's mapping reads: no memory for weights, no run)."""
    found = getattr(args, "_trace_model", None)
    if found is None:
        from layerscope.zoo.specs import check_spec

        check_spec(args.model, config=_config(args))  # before torch, as profile's SPEC
        import torch

        from layerscope.zoo.specs import resolve_model

        resolved = resolve_model(args.model, device=torch.device("meta"), config=_config(args))
        args._trace_resolved = resolved
        found = args._trace_model = resolved.model
    return found


def _trace_inputs(args: argparse.Namespace) -> Any:
    """The inputs the ``--model`` was called with, for a trace without module events:
    ``--inputs SPEC``, tensors of the ``--input`` shapes, or the SPEC's default inputs
    (None: it has none)."""
    from layerscope.zoo.specs import resolve_inputs

    resolved = args._trace_resolved
    if getattr(args, "input", None) or getattr(args, "inputs", None):
        return _inputs_from(args, args.model, _input_shapes(args), resolved, resolve_inputs)
    return resolved.inputs


def _rank_of(run: Any, rank: int, name: str) -> Any:
    try:
        return run.rank_profile(rank)
    except KeyError as exc:
        raise UsageError(f"{name}: {exc.args[0]}") from None


def _merge(args: argparse.Namespace) -> int:
    """Merge rank files; a mismatch is a MergeError (exit 2)."""
    from layerscope.base.formats import format_for_path, formats
    from layerscope.model.diff import parse_duration_ns, parse_threshold
    from layerscope.model.ranks import MergedRun, RankRecord, RankTraces, merge

    try:
        threshold = parse_threshold(args.threshold)
    except ValueError as exc:
        raise UsageError(f"--threshold: {exc}") from None
    try:
        floor = parse_duration_ns(args.min_time)
    except ValueError as exc:
        raise UsageError(f"--min-time: {exc}") from None
    output = args.output
    # A trace of the rank files (.trace.json, --format chrome), else the merged run's formats.
    traces = (args.format or format_for_path(output or "", default="", document="rank-traces")) in formats("rank-traces")
    document = "rank-traces" if traces else "ranks"
    fmt = _output_format(args, document)
    options = _format_options(args, document, fmt)
    if output:
        _check_writable(output)
    files_of_rank: dict[int, str] = {}

    def loaded() -> Iterator[Any]:
        # One file at a time: merge keeps what a merged run needs and drops the rest. Rank
        # traces (the slow part: seconds each) load in processes of their own, each
        # handing back only its rank's record.
        for path, item in _rank_items(args, parallel=not traces):
            if isinstance(item, MergedRun):
                if traces:
                    raise UsageError(
                        f"{path} is a merged run, which keeps no traces; --format chrome needs the rank files"
                    )
            else:
                files_of_rank.setdefault(item.rank if isinstance(item, RankRecord) else item.meta.rank, path)
            yield item

    run = merge(loaded(), sources=args.files, threshold=threshold, min_time_ns=floor)
    if traces:
        every = RankTraces(_load_profile(files_of_rank[rank], args) for rank in run.rank_numbers)
        return _emit(every, args, fmt, options, f"the {fmt} trace of every rank")
    return _emit(run, args, fmt, options, f"the merged run ({fmt})")


def _rank_items(args: argparse.Namespace, *, parallel: bool) -> Iterator[tuple[str, Any]]:
    """``(path, item)`` for each of ``args.files`` in order: a saved profile or merged run
    as read; with ``parallel`` and two or more torch.profiler traces among them, on a
    machine of several cores, each trace read in a process of its own (as many at once
    as ``--jobs``, default the cores), which hands back its rank's record
    (``ranks.rank_record``), not the whole profile."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    from layerscope.base.kineto_json import is_kineto_trace

    traced = [path for path in args.files if os.path.isfile(path) and is_kineto_trace(path)]
    workers = min(len(traced), getattr(args, "jobs", None) or os.cpu_count() or 1)
    if not parallel or workers < 2:
        for path in args.files:
            yield path, _load_profile(path, args)
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=_worker_context()) as pool:
        pending = {path: pool.submit(_rank_record_of, path, args) for path in traced}
        try:
            for path in args.files:
                future = pending.get(path)
                yield path, _load_profile(path, args) if future is None else future.result()
        finally:
            for future in pending.values():
                future.cancel()


def _rank_record_of(path: str, args: argparse.Namespace) -> Any:
    """In a worker process: the record of the rank whose trace ``path`` is."""
    from layerscope.model.ranks import rank_record

    return rank_record(_load_profile(path, args), path)


def _worker_context() -> Any:
    """Processes started by forking this one where that is safe (Linux, no other thread
    running: torch is imported but has run nothing), else by a fresh interpreter."""
    import multiprocessing
    import sys
    import threading

    fork = sys.platform.startswith("linux") and threading.active_count() == 1
    return multiprocessing.get_context("fork" if fork else "spawn")


def _plot_memory(args: argparse.Namespace) -> int:
    if not args.output.lower().endswith(".png"):
        raise UsageError(f"plot-memory writes a PNG: give -o a name ending in .png, got {args.output!r}")
    profile = _load_profile(args.profile)
    from layerscope.model.ranks import MergedRun
    from layerscope.render.plot import memory_timeline

    if isinstance(profile, MergedRun):
        raise UsageError(f"{args.profile} is a merged run, which keeps no memory timelines: give one rank's file")

    try:
        memory_timeline(profile)
    except ValueError as exc:
        raise UsageError(f"{args.profile}: {exc}") from exc
    _check_writable(args.output)
    with _needs_package("plot-memory"):
        _write_file(args.output, lambda: profile.save(args.output, "png", title=args.title), "the memory timeline")
    return 0


def _diff(args: argparse.Namespace) -> int:
    """Exit 0 when nothing regressed above --fail-above, 1 when something did."""
    from layerscope.model.diff import (
        diff,
        metric_named,
        parse_duration_ns,
        parse_threshold,
        resolve_metric,
    )
    from layerscope.render.diff_text import regressions_line

    try:
        threshold = None if args.fail_above is None else parse_threshold(args.fail_above)
    except ValueError as exc:
        raise UsageError(f"--fail-above: {exc}") from None
    try:
        floor = None if args.min_time is None else parse_duration_ns(args.min_time)
    except ValueError as exc:
        raise UsageError(f"--min-time: {exc}") from None
    fmt = _output_format(args, "diff")
    options = _format_options(args, "diff", fmt)
    if args.output:
        _check_writable(args.output)
    try:
        if args.diff_metric is not None:
            metric_named(args.diff_metric)  # an unknown name, before loading anything
    except ValueError as exc:
        raise UsageError(f"--metric: {exc}") from None
    base, new, imbalance = _diff_sides(args)
    try:
        resolve_metric(base, new, args.diff_metric)
    except ValueError as exc:
        raise UsageError(f"--metric: {exc}") from None
    result = diff(base, new, min_time_ns=floor, metric=args.diff_metric)
    regressions = [] if threshold is None else result.regressions(threshold)
    verdict = None if threshold is None else regressions_line(regressions, threshold)
    _emit(result, args, fmt, {**options, "imbalance": imbalance, "fail_above": threshold}, f"the {fmt} diff")
    if verdict and (args.output or fmt != "text"):
        print(verdict, file=sys.stderr)  # the report went elsewhere; a CI log still says why
    return 1 if regressions else 0


def _diff_sides(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The two profiles to compare, and for two merged runs the changes in imbalance.

    Two profiles: as they are. A merged run with --ranks A B: its ranks A and B. Two
    merged runs: their median ranks' trees, and how each node's imbalance moved."""
    from layerscope.model.ranks import MergedRun, imbalance_changes

    base = _load_profile(args.base, args, bar=True)
    if args.ranks is not None:
        if args.new is not None or not isinstance(base, MergedRun):
            raise UsageError("--ranks A B compares two ranks of one merged run: give that run alone (diff MERGED --ranks A B)")
        first, second = args.ranks
        return _rank_of(base, first, args.base), _rank_of(base, second, args.base), None
    if args.new is None:
        raise UsageError("diff needs BASE and NEW, or a merged run and --ranks A B")
    new = _load_profile(args.new, args, bar=True)
    merged = (isinstance(base, MergedRun), isinstance(new, MergedRun))
    if merged == (True, True):
        return base.median_profile(), new.median_profile(), imbalance_changes(base, new)
    if any(merged):
        which = args.base if merged[0] else args.new
        raise UsageError(
            f"{which} is a merged run and the other a profile: compare two merged runs, two profiles, "
            f"or two ranks of a merged run (--ranks A B)"
        )
    return base, new, None


def _load_bench(path: str) -> Any:
    from layerscope.bench import BenchResult
    from layerscope.loading import expect, read_saved

    try:
        return expect(read_saved(path, "benchmark"), repr(path), BenchResult)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        raise UsageError(f"cannot read {path!r}: {exc.strerror or exc}") from exc


def _bench_compare(args: argparse.Namespace) -> int:
    """Exit 0, or 1 when --fail-above is given and a batch size regressed beyond it."""
    from layerscope.bench import compare
    from layerscope.model.diff import parse_threshold

    try:
        threshold = None if args.fail_above is None else parse_threshold(args.fail_above)
    except ValueError as exc:
        raise UsageError(f"--fail-above: {exc}") from None
    result = compare(_load_bench(args.compare[0]), _load_bench(args.compare[1]))
    _print(result.render())
    regressions = [] if threshold is None else result.regressions(threshold)
    for row in regressions:
        print(f"regression: batch size {row.batch_size} is x{row.ratio:.3f} slower (above {threshold:.0%})", file=sys.stderr)
    return 1 if regressions else 0


def _bench(args: argparse.Namespace) -> int:
    if args.compare:
        if args.spec:
            raise UsageError("give either SPEC to benchmark or --compare BASE NEW, not both")
        return _bench_compare(args)
    if not args.spec:
        raise UsageError("bench needs a SPEC to benchmark (e.g. zoo:mlp), or --compare BASE NEW")
    _check_specs(args, args.spec)

    from layerscope.base.formats import render
    from layerscope.base.io import write_atomic
    from layerscope.bench import benchmark
    from layerscope.zoo.specs import load_callable, parse_dtype, resolve_model

    if args.plot and not args.plot.lower().endswith(".png"):
        raise UsageError(f"--plot writes a PNG: give a name ending in .png, got {args.plot!r}")
    shapes = _input_shapes(args)
    # -o's format (JSON unless its extension says otherwise); stdout's is text.
    fmt = _output_format(args, "bench", default="json" if args.output else "text")
    options = _format_options(args, "bench", fmt)
    for path in filter(None, (args.output, args.plot)):
        _check_writable(path)
    device = _device(args.device)
    dtype, autocast = (parse_dtype(text) if text else None for text in (args.dtype, args.autocast))
    resolved = resolve_model(args.spec, batch_size=1, config=_config(args))
    # --inputs names a builder here: it is called with each batch size.
    sample = _inputs_from(args, args.spec, shapes, resolved, lambda spec: load_callable(spec, "inputs"))
    from layerscope.bench.measure import BenchInterrupted

    interrupted = False
    with _progress_bar(sys.stderr.isatty()) as report:
        try:
            result = benchmark(
                resolved.model, sample, args.batch_sizes, mode=args.mode, warmup=args.warmup,
                min_runs=args.min_runs, min_time_s=args.min_time, device=device, dtype=dtype,
                autocast=autocast, compile=args.compile, lr=args.lr, memory=not args.no_memory,
                find_max_batch=args.max_batch, progress=report,
            )
        except BenchInterrupted as stop:  # Ctrl-C: show (and save) what finished, then exit 130
            result, interrupted = stop.result, True
    result.model = resolved.label
    if args.output:
        _print(render(result, "text"))
    _emit(result, args, fmt, options, f"the benchmark ({fmt})")
    if args.plot:
        with _needs_package("bench --plot"):
            _write_file(args.plot, lambda: write_atomic(args.plot, render(result, "png")), "the plot")
    if interrupted:
        print("layerscope: interrupted; the batch sizes that finished are above", file=sys.stderr)
        return 130
    return 0


def _list_zoo() -> int:
    from layerscope import zoo

    width = max(len(n) for n in zoo.names())
    _print("".join(f"zoo:{name.ljust(width)}  {zoo.get(name).description}\n" for name in zoo.names()))
    return 0


#: Said at the end of an error line that --debug would explain further.
_DEBUG_HINT = " [--debug: the traceback]"
#: Words of torch's errors about a tensor's shape ("mat1 and mat2 shapes cannot be
#: multiplied", "expected input[2, 5] to have 3 channels", "The size of tensor a (5) must
#: match the size of tensor b (4) at non-singleton dimension 1").
_SHAPE_WORDS = re.compile(r"shape|size|dimension|channels|\bdims?\b", re.I)


def _first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (torch's errors may run over several)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[0] + (" ..." if len(lines) > 1 else "")) if lines else type(exc).__name__


def _raised(exc: BaseException) -> str:
    """``ValueError in module '1' (Inner): bad thing happened``, with layerscope's other
    notes (a transformers model's inputs hint) after it: one line."""
    from layerscope.capture.modules import RAISED_NOTE

    prefix = RAISED_NOTE.split("{", 1)[0]
    notes = [str(note) for note in getattr(exc, "__notes__", ())]
    where = next((note.removeprefix("layerscope: raised ") for note in notes if note.startswith(prefix)), None)
    if where is not None and where.startswith("in module '(the model)' "):
        where = "in the model's own forward " + where.removeprefix("in module '(the model)' ")
    others = [note.removeprefix("layerscope: ") for note in notes if not note.startswith(prefix)]
    return (
        f"{type(exc).__name__}{' ' + where if where else ''}: {_first_line(exc)}"
        + "".join(f"; {' '.join(note.split())}" for note in others)
    )


def _given_inputs(args: argparse.Namespace) -> str | None:
    """The input shapes the user chose on the command line (``--input 2x5``), as given;
    None where the model's own default inputs or an ``--inputs`` callable's ran."""
    shapes = getattr(args, "input", None)
    return " ".join(f"--input {shape}" for shape in shapes) if shapes else None


def _names_a_given_shape(exc: BaseException, shapes: Sequence[str]) -> bool:
    """Whether torch refused one of the ``--input`` shapes themselves: a RuntimeError,
    ValueError or IndexError about shapes, sizes, dimensions or channels whose message
    names a given shape (``2x5``, ``[2, 5]``), so the model's own mismatch deeper in
    (its layers' sizes, with the inputs long taken) stays the model's."""
    if not isinstance(exc, (RuntimeError, ValueError, IndexError)):
        return False
    message = str(exc)
    if not _SHAPE_WORDS.search(message):
        return False
    for shape in shapes:
        dims = re.findall(r"\d+", shape.split(":", 1)[0])
        if dims and any(form in message for form in ("x".join(dims), f"[{', '.join(dims)}]")):
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except OutputError as exc:
        if exc.destination == "stdout":
            _drop_stdout()
            if isinstance(exc.error, BrokenPipeError):
                return 0  # the reader stopped early (`| head`): nothing failed here
        print(f"layerscope: error: {exc}", file=sys.stderr)
        return EXIT_WRITE_FAILED


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except OSError as exc:
        raise OutputError("stdout", exc) from exc


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def one_line(message: Any, category: type[Warning], *rest: Any, **kwargs: Any) -> None:
            if not issubclass(category, LayerscopeWarning):
                shown(message, category, *rest, **kwargs)
                return
            print(f"layerscope: warning: {str(message).removeprefix('layerscope: ')}", file=sys.stderr)

        warnings.showwarning = one_line
        with _interrupts_exit():
            status = _dispatch(args)
    _flush_stdout()
    return status


def _dispatch(args: argparse.Namespace) -> int:
    debug = getattr(args, "debug", False)
    try:
        if args.command == "zoo":
            return _list_zoo()
        if args.command == "demo":
            return _run_profile(args, DEMO_SPEC)
        if args.command == "plot-memory":
            return _plot_memory(args)
        if args.command == "diff":
            return _diff(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "show":
            return _show(args)
        if args.command == "merge":
            return _merge(args)
        if args.command == "flops":
            return _run_profile(args, args.spec, count_only=True)
        return _run_profile(args, args.spec)
    except OutputError:
        raise
    except LayerscopeError as exc:
        if debug:
            traceback.print_exc()
        print(f"layerscope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("layerscope: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            traceback.print_exc()
        if args.command in _RUNS_A_MODEL:
            given = _given_inputs(args)
            if given and _names_a_given_shape(exc, getattr(args, "input", None) or []):
                # The shapes the user gave do not fit the model: bad input, not the model's fault.
                print(f"layerscope: error: {given} does not fit the model: {_raised(exc)}", file=sys.stderr)
                return 2
            print(f"layerscope: error: the model raised {_raised(exc)}" + ("" if debug else _DEBUG_HINT), file=sys.stderr)
            return 1
        # Not a model's fault and not bad input: say so, with its own exit status (diff
        # uses 1 for "regressed").
        print(
            f"layerscope: internal error {type(exc).__name__}: {_first_line(exc)} (please report it"
            + (")" if debug else ", with --debug's traceback)"),
            file=sys.stderr,
        )
        return 3
