"""Every example in the README and in docs/*.md runs: the Python blocks, each CLI line,
and each benchmark command of docs/benchmarks.md in a small form.

``test_every_docs_example_is_run`` keeps the list honest: each fenced block of
docs/*.md is either run by one of the tests here or named below as an output sample."""

from __future__ import annotations

import glob
import json
import re
import shlex
from pathlib import Path

import pytest

from processes import Done, run_layerscope, run_python

README = Path(__file__).resolve().parent.parent / "README.md"
ROOT = README.parent
DOCS = ROOT / "docs"


def _blocks(lang: str, text: str | None = None) -> list[str]:
    text = README.read_text(encoding="utf-8") if text is None else text
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _doc(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _fences(text: str) -> list[tuple[str, str]]:
    """Every fenced block of a Markdown text: (language, body); "" for an untagged fence."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


@pytest.mark.slow
def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks("python")
    assert blocks, "the README has no Python example"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "alexnet.json").exists()


@pytest.mark.slow
def test_docs_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python blocks of the docs that start no profiler of torch's (flops.md: the op
    pass and a custom op's formula), in this process. memory.md's and migrating.md's run
    ``Profiler`` blocks, each doc in a process of its own (tests below)."""
    monkeypatch.chdir(tmp_path)
    for doc in ("flops.md",):
        path = DOCS / doc
        blocks = _blocks("python", path.read_text(encoding="utf-8"))
        assert blocks, f"docs/{doc} has no Python example"
        for block in blocks:
            exec(compile(block, str(path), "exec"), {"__name__": "__docs__"})


#: Runs each block given as its second argument (a JSON list) in order, in one process,
#: each in a fresh namespace as a script of its own; a traceback names the doc and the block.
_BLOCKS_DRIVER = """
import json, sys
for n, block in enumerate(json.loads(sys.argv[2]), 1):
    exec(compile(block, f"{sys.argv[1]}, Python block {n}", "exec"), {"__name__": "__main__"})
"""


def _run_python_blocks(doc: str, blocks: list[str], cwd: Path) -> Done:
    """The blocks in a process of their own, forked from the warm interpreter (``processes.py``)."""
    return run_python(["-c", _BLOCKS_DRIVER, f"docs/{doc}", json.dumps(blocks)], cwd)


def _cli_lines(text: str | None = None, lang: str = "bash") -> list[list[str]]:
    lines = []
    for block in _blocks(lang, text):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith(("layerscope ", "torchrun ")):
                lines.append(shlex.split(line))
    return lines


def _command(argv: list[str], cwd: Path) -> list[str]:
    """The line's words as the shell would pass them: globs expanded in ``cwd``."""
    words = []
    for word in argv[1:]:
        found = sorted(glob.glob(word, root_dir=cwd)) if any(c in word for c in "*?[") else []
        words.extend(found or [word])
    return words


def _run_line(argv: list[str], cwd: Path) -> Done:
    """The line run in ``cwd`` as its own process (``processes.py``): ``layerscope``, or
    ``torchrun`` as this Python's ``torch.distributed.run``."""
    words = _command(argv, cwd)
    if argv[0] != "torchrun":
        return run_layerscope(words, cwd)
    return run_python(["-m", "torch.distributed.run", *words], cwd)


def _assert_ran(result: Done, what: object) -> None:
    assert result.returncode == 0, (what, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, (what, result.stderr[-2000:])


@pytest.fixture(scope="module")
def shell_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for all the README's command lines, run in order, as a reader would:
    a line may read the file an earlier one wrote."""
    return tmp_path_factory.mktemp("readme_shell")


@pytest.mark.slow
@pytest.mark.parametrize("argv", _cli_lines(), ids=lambda argv: " ".join(argv))
def test_readme_cli_lines_run(argv: list[str], shell_dir: Path) -> None:
    result = _run_line(argv, shell_dir)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_memory_doc_runs(tmp_path: Path) -> None:
    """docs/memory.md in one folder: its Python example (a ``Profiler`` around a training
    step, saved as profile.json) in a process of its own, then its command line draws
    that profile's memory timeline."""
    text = _doc("memory.md")
    blocks = _blocks("python", text)
    assert len(blocks) == 1
    _assert_ran(_run_python_blocks("memory.md", blocks, tmp_path), "docs/memory.md's Python block")
    lines = _cli_lines(text)
    assert [argv[:2] for argv in lines] == [["layerscope", "plot-memory"]]
    for argv in lines:
        _assert_ran(_run_line(argv, tmp_path), argv)
    assert (tmp_path / "memory.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_migrating_doc_python_blocks_run(tmp_path: Path) -> None:
    """docs/migrating.md's drop-ins (torchprof, DeepSpeed, the torch.profiler recipe), in
    order in one process of their own: the recipe's ``Profiler`` blocks start torch's
    profiler, as a user's script would."""
    blocks = _blocks("python", _doc("migrating.md"))
    assert len(blocks) == 3
    _assert_ran(_run_python_blocks("migrating.md", blocks, tmp_path), "docs/migrating.md's Python blocks")
    # The recipe's exports, and one trace per cycle of its schedule.
    assert (tmp_path / "trace.json").exists() and (tmp_path / "stacks.txt").exists()
    assert (tmp_path / "trace_4.json").exists()


#: A user's file of their own, as docs/bench.md's third line names one: a model builder
#: and a callable that makes a batch of any size.
MYMODELS = '''\
from layerscope import zoo


def build():
    return zoo.get("mlp").build()


def batch_of(batch_size):
    return zoo.get("mlp").example_inputs(batch_size)
'''


@pytest.mark.slow
def test_bench_doc_lines_run(tmp_path: Path) -> None:
    """docs/bench.md's command lines, in order in one folder. The reader's own files are
    stood in for: ``mymodels.py`` (MYMODELS), and the two saved runs that ``--compare``
    reads, copies of the first line's mlp.json (the same run twice: nothing slower, exit 0).
    The ``--device cuda`` line runs as written on a machine with CUDA; without one it must
    refuse in one line (exit 2), and runs on the CPU instead."""
    import torch

    lines = _cli_lines(_doc("bench.md"))
    assert len(lines) == 4 and all(argv[:2] == ["layerscope", "bench"] for argv in lines)
    (tmp_path / "mymodels.py").write_text(MYMODELS, encoding="utf-8")
    for argv in lines:
        if "--compare" in argv:
            for name in argv[argv.index("--compare") + 1 :][:2]:
                (tmp_path / name).write_bytes((tmp_path / "mlp.json").read_bytes())
        if "cuda" in argv and not torch.cuda.is_available():
            refused = _run_line(argv, tmp_path)
            assert refused.returncode == 2, refused.stderr[-2000:]
            message = refused.stderr.strip().splitlines()
            assert len(message) == 1 and "no CUDA device" in message[0], refused.stderr[-2000:]
            argv = [("cpu" if word == "cuda" else word) for word in argv]
        _assert_ran(_run_line(argv, tmp_path), argv)
    assert (tmp_path / "mlp.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_distributed_doc_lines_run(tmp_path: Path) -> None:
    """docs/distributed.md's command lines, in order, in one folder: the example job
    under torchrun, then merging, showing and diffing its files."""
    text = _doc("distributed.md")
    lines = _cli_lines(text)
    assert lines[0][0] == "torchrun" and len(lines) > 8
    for argv in lines:
        result = _run_line(argv, tmp_path)
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        assert "Traceback" not in result.stderr


#: What docs/distributed.md's training loop leaves to the reader (a DDP model, a loader
#: of batches with ``.x`` and ``.y``, a loss and an optimizer), here for one rank of a
#: gloo group of one, in a process of its own.
DDP_LOOP_SETUP = """\
import gc
import os
from collections import namedtuple

import torch
import torch.distributed as dist

import layerscope
from layerscope import zoo

dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"), rank=0, world_size=1)
ddp_model = torch.nn.parallel.DistributedDataParallel(zoo.get("mlp").build())
Batch = namedtuple("Batch", "x y")
loader = [Batch(zoo.get("mlp").example_inputs(8), torch.randint(0, 10, (8,)))] * 10
loss_fn = torch.nn.functional.cross_entropy
opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
"""
DDP_LOOP_TEARDOWN = """
del ddp_model, prof
gc.collect()  # DDP's reducer before its process group
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_distributed_doc_profiler_loop_runs(tmp_path: Path) -> None:
    """docs/distributed.md's training loop (the untagged block under "Profiling a torchrun
    job") runs as written, with DDP_LOOP_SETUP's names, and writes a file per cycle under
    the name the doc gives: run/layerscope_steps{a}-{b}_rank{r}.json."""
    loops = [body for lang, body in _fences(_doc("distributed.md")) if body.startswith("with layerscope.Profiler(")]
    assert len(loops) == 1
    script = DDP_LOOP_SETUP + loops[0] + DDP_LOOP_TEARDOWN
    _assert_ran(run_python(["-c", script], tmp_path), "docs/distributed.md's training loop")
    # 10 steps, schedule(wait=1, warmup=1, active=3): two cycles, steps 2-4 and 7-9.
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "layerscope_steps2-4_rank0.json", "layerscope_steps7-9_rank0.json"
    ]


@pytest.mark.slow
def test_traces_doc_lines_run(tmp_path: Path) -> None:
    """docs/traces.md: each Python example in a process of its own (each runs torch's
    profiler, as a user's script would, once); then its command lines read the trace the
    first one wrote."""
    text = _doc("traces.md")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    for block in blocks:
        result = run_python(["-c", block], tmp_path)
        assert result.returncode == 0, (block[:200], result.stderr[-2000:])
    lines = _cli_lines(text)
    assert len(lines) >= 5
    for argv in lines:
        result = _run_line(argv, tmp_path)
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        assert "Traceback" not in result.stderr


#: Records a trace of the zoo resnet18's forward as a user's run would (``with_stack`` for
#: the modules, ``record_shapes`` for FLOPs), gzipped: docs/traces.md's run.pt.trace.json.gz.
RECORD_RESNET18 = """\
import torch
from torch.profiler import profile

from layerscope import zoo

entry = zoo.get("resnet18")
model = entry.build().eval()
x = entry.example_inputs(1)
with torch.no_grad():
    model(x)
    with profile(record_shapes=True, with_stack=True) as prof:
        model(x)
prof.export_chrome_trace("run.pt.trace.json.gz")
"""


@pytest.mark.slow
def test_traces_doc_overview_lines_run(tmp_path: Path, shared_traces: Path) -> None:
    """The command lines at the top of docs/traces.md (a ``text`` block), in one folder,
    on stand-ins for the reader's files: run.pt.trace.json.gz a zoo resnet18 trace
    recorded here; h100.json.gz and mi300x.json.gz the real BERT-small traces of
    ../shared/traces/; rank*.json.gz that folder's DDP rank-0 trace and a rank 1 made
    from it (only its ``distributedInfo`` differs)."""
    import gzip

    lines = _cli_lines(_doc("traces.md"), lang="text")
    assert [argv[:2] for argv in lines] == [
        ["layerscope", "show"], ["layerscope", "show"], ["layerscope", "show"], ["layerscope", "show"],
        ["layerscope", "diff"], ["layerscope", "merge"],
    ]
    recorded = run_python(["-c", RECORD_RESNET18], tmp_path)
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    (tmp_path / "h100.json.gz").symlink_to(shared_traces / "h100_bert_small_inference.json.gz")
    (tmp_path / "mi300x.json.gz").symlink_to(shared_traces / "mi300x_bert_small_inference.json.gz")
    rank0 = shared_traces / "mi300x_resnet_ddp_actckpt_train_rank0.json.gz"
    (tmp_path / "rank0.json.gz").symlink_to(rank0)
    with gzip.open(rank0, "rt") as handle:
        doc = json.load(handle)
    doc["distributedInfo"]["rank"] = 1
    with gzip.open(tmp_path / "rank1.json.gz", "wt", compresslevel=1) as handle:
        json.dump(doc, handle)
    for argv in lines:
        _assert_ran(_run_line(argv, tmp_path), argv)
    assert json.loads((tmp_path / "merged.json").read_text(encoding="utf-8"))["schema"].startswith("layerscope-ranks/")


# -- docs/benchmarks.md -------------------------------------------------------------------

#: How each benchmark command of docs/benchmarks.md runs here: the documented command
#: with these option values (one round, one step, the smallest model the script offers),
#: so the same code runs end to end, small; an option the doc does not give is added.
#: A flag is given as None.
BENCHMARK_SMOKE: dict[str, dict[str, str | None]] = {
    "benchmarks.overhead": {"--rounds": "1", "--models": "mlp"},
    "benchmarks.module_boundary": {"--rounds": "1", "--layers": "10"},
    "benchmarks.flops": {"--rounds": "1", "--models": "mlp", "--no-llama": None},
    # gpt: the zoo's, no transformers; forward, training step and profile(backward=True).
    "benchmarks.fidelity": {"--rounds": "1", "--steps": "1", "--models": "gpt"},
    "benchmarks.steps": {
        "--rounds": "1", "--per-round": "1", "--block-steps": "1", "--models": "mlp", "--steps": "1", "--torch-steps": "1",
    },
    "benchmarks.memory": {"--rounds": "1", "--per-round": "1", "--models": "mlp"},
    # --steps 2: a block's first step is not timed.
    "benchmarks.distributed": {"--rounds": "1", "--steps": "2"},
    "benchmarks.compiled": {"--rounds": "1", "--models": "mlp"},
    "benchmarks.harness": {"--rounds": "1", "--runs": "1"},
    "benchmarks.replay_exit": {"--rounds": "1", "--steps": "2"},
    # BERT-base's template (302 ops) and trace (5,172 events); the zoo gpt, 20 ms of steps a session.
    "benchmarks.align": {
        "--rounds": "1", "--sizes": "1000", "--template": "h100_bert_base_fwd", "--traces": "h100_bert_base_fwd",
        "--models": "gpt", "--warm": "1", "--steps": "1", "--session-ms": "20",
    },
}
#: The benchmark commands whose smallest run is too long for the suite (measured on the
#: 2-core VM), by module, or by module and an option of the line: only their command line
#: is checked here (``--help`` exits 0 and names every option the doc gives).
BENCHMARK_HELP_ONLY = {
    "benchmarks.exports": "its BERT-base op tables and GPT-2 step have no smaller size: 14-28 s",
    "benchmarks.merge": "its BERT-base step has no smaller size, and it starts three processes: 18-22 s",
    "benchmarks.html_report": "BERT-base and a 1,000-module page at the least, in chromium",
    "benchmarks.traces": "OWLv2 loads in fresh processes and six resnet18 recording sessions at the least: 37-90 s",
    "benchmarks.distributed --model gpt2": "the script runs end to end on its MLP line; GPT-2 adds 22 s",
    "benchmarks.gpu": "run in its CPU smoke mode by tests/test_gpu_check.py",
    "benchmarks.commands": "thirteen cold commands, each twice (timed, then under -X importtime), four of them traces: 14 s",
}


def _benchmark_commands() -> list[list[str]]:
    """Every benchmark command of docs/benchmarks.md: the lines of its fenced blocks, and
    commands written inline, that run ``python`` on a benchmark."""
    text = _doc("benchmarks.md")
    found = []
    for _, body in _fences(text):
        found += [line.strip() for line in body.splitlines()]
    found += re.findall(r"`((?:\.venv/bin/)?python [^`\n]+)`", text)
    commands = []
    for line in found:
        argv = shlex.split(line, comments=True)
        benchmark = argv[1:3] if argv[1:2] == ["-m"] else ["-m", *argv[1:2]]
        if argv and argv[0].endswith("python") and re.fullmatch(r"benchmarks[./]\w+(\.py)?", benchmark[-1]):
            if argv not in commands:
                commands.append(argv)
    return commands


def _module(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """(module name, how the doc runs it, its options) of ``python -m M ...`` or ``python benchmarks/m.py ...``."""
    if argv[1] == "-m":
        return argv[2], ["-m", argv[2]], argv[3:]
    return argv[1].removesuffix(".py").replace("/", "."), [argv[1]], argv[2:]


def _options(words: list[str]) -> dict[str, str | None]:
    options: dict[str, str | None] = {}
    for n, word in enumerate(words):
        if word.startswith("--"):
            value = words[n + 1] if n + 1 < len(words) and not words[n + 1].startswith("--") else None
            options[word] = value
    return options


@pytest.mark.slow
@pytest.mark.parametrize("argv", _benchmark_commands(), ids=lambda argv: " ".join(argv[1:]))
def test_benchmarks_doc_commands_run_small(argv: list[str]) -> None:
    """Each benchmark command of docs/benchmarks.md, with BENCHMARK_SMOKE's values, exits
    0; or, for BENCHMARK_HELP_ONLY's, its command line parses. Run from the checkout's
    root, as the doc runs them."""
    module, entry, words = _module(argv)
    options = _options(words)
    keys = [f"{module} {option} {value}" if value else f"{module} {option}" for option, value in options.items()]
    help_only = next((BENCHMARK_HELP_ONLY[k] for k in [*keys, module] if k in BENCHMARK_HELP_ONLY), None)
    if help_only is None:
        assert module in BENCHMARK_SMOKE, f"{module}: give it small values in BENCHMARK_SMOKE, or a reason in BENCHMARK_HELP_ONLY"
        options.update(BENCHMARK_SMOKE[module])
        args = [word for option, value in options.items() for word in ([option] if value is None else [option, value])]
        _assert_ran(run_python([*entry, *args], ROOT), [module, *args])
        return
    result = run_python([*entry, "--help"], ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    missing = [option for option in options if option not in result.stdout]
    assert not missing, f"{module} --help has no {missing}"


# -- the list of docs/*.md's examples -------------------------------------------------------

#: The fenced blocks of docs/*.md that are not examples to run (output samples, a
#: diagram), by doc and the start of their first line.
NOT_EXAMPLES = {
    ("bench.md", "zoo:mlp: inference, float32, cpu"),  # bench's printed result
    ("design.md", "cli, session, block, loading, handlers,"),  # the folders, as the layers
    ("distributed.md", "DistributedDataParallel  ·  cpu"),  # a rank's printed tree
    ("distributed.md", "Ranks  ·  DistributedDataParallel"),  # the merged report
    ("traces.md", "Modules: aligned to the model's call template"),  # a footer line (test_aligned_traces.py)
}
#: The test here that runs each doc's fenced blocks of each language.
RUN_BY = {
    ("bench.md", "bash"): test_bench_doc_lines_run,
    ("benchmarks.md", "bash"): test_benchmarks_doc_commands_run_small,
    ("benchmarks.md", "text"): test_benchmarks_doc_commands_run_small,  # gpu.py's line
    ("distributed.md", "bash"): test_distributed_doc_lines_run,
    ("distributed.md", ""): test_distributed_doc_profiler_loop_runs,
    ("flops.md", "python"): test_docs_python_blocks_run,
    ("memory.md", "python"): test_memory_doc_runs,
    ("memory.md", "bash"): test_memory_doc_runs,
    ("migrating.md", "python"): test_migrating_doc_python_blocks_run,
    ("traces.md", "python"): test_traces_doc_lines_run,
    ("traces.md", "bash"): test_traces_doc_lines_run,
    ("traces.md", "text"): test_traces_doc_overview_lines_run,
}


def test_every_docs_example_is_run() -> None:
    """Each fenced block of docs/*.md is an output sample (NOT_EXAMPLES) or has a test
    that runs it (RUN_BY); and every line of a command block is one those tests run: a
    ``layerscope`` or ``torchrun`` line, or a benchmark's ``python`` command."""
    unrun = []
    for path in sorted(DOCS.glob("*.md")):
        for lang, body in _fences(path.read_text(encoding="utf-8")):
            first = body.strip().splitlines()[0] if body.strip() else ""
            if any(doc == path.name and first.startswith(start) for doc, start in NOT_EXAMPLES):
                continue
            if (path.name, lang) not in RUN_BY:
                unrun.append((path.name, lang, first))
                continue
            if lang in ("bash", "text") or path.name == "benchmarks.md":
                for line in body.splitlines():
                    words = shlex.split(line, comments=True)
                    runs = words[:1] in (["layerscope"], ["torchrun"]) or (
                        path.name == "benchmarks.md" and words and words[0].endswith("python")
                    )
                    if words and not runs:
                        unrun.append((path.name, lang, line))
    assert not unrun, f"fenced examples no test runs: {unrun}"
