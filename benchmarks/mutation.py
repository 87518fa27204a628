"""Mutation testing of layerscope's core: do the tests notice when the code is wrong?

mutmut (3.x) rewrites one target module many times, each copy ("mutant") with one small
change (``+`` for ``-``, ``<`` for ``<=``, a constant off by one, a ``return`` of None...),
and runs the tests against each. A mutant the tests fail on is *killed*; one they pass
on *survived*: a change to the code no test noticed. The score of a module is the share
of its mutants killed (timeouts count as killed: the change made the tests hang),
leaving out the mutants named in ``EQUIVALENT`` below, changes that cannot alter
behaviour.

**Where it runs.** Never in the checkout: each module gets a scratch copy of ``src/``,
``tests/`` and ``pyproject.toml`` (the files git tracks or would track, so uncommitted
work is measured) under ``--workdir``, and mutmut writes its ``mutants/`` folder there.

**Which tests.** Each mutant runs against the test files listed for its module in
``TESTS`` (not the whole suite, which takes minutes), and only the tests among them
that call the mutated function (mutmut records which ones in a first, clean run),
without the ``slow`` tier.

**What mutmut cannot see, and what this script does about it.**

- mutmut leaves decorated functions alone. The scratch copy of a target rewrites each
  ``@register_flops(...)`` definition as a plain ``def`` followed by
  ``register_flops(...)(name)``: the same program, whose formulas mutmut then mutates.
  Functions defined inside an ``if`` at module level are still not mutated.
- mutmut switches mutants on per call, in processes forked after layerscope was
  imported, so a mutant in code that runs at import time (formula factories such as
  ``_per_output_element(2)`` called while registering) is never switched on in the
  fork. ``--recheck`` runs every survivor again in a fresh interpreter against all of
  its module's test files (a few seconds each): one that fails there is counted killed.

Usage::

    python benchmarks/mutation.py                         # the default modules
    python benchmarks/mutation.py --modules convert/device.py,base/stats.py
    python benchmarks/mutation.py --list                  # modules and their tests
    python benchmarks/mutation.py --show-survivors        # diffs of what survived
    python benchmarks/mutation.py --modules flops/formulas.py --recheck
    python benchmarks/mutation.py --reuse                 # the last run's results again
    python benchmarks/mutation.py --from-json runs.json   # statuses written by --json
    python benchmarks/mutation.py --write-baseline        # record the scores

Needs ``pip install -e .[mutation]``. The exit status is 1 when a module's score fell
below its figure in ``benchmarks/mutation_baseline.json``. Not part of the pytest suite:
run it on demand; docs/testing.md records the scores.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "benchmarks" / "mutation_baseline.json"

#: Each target (a file, or a package folder: all of its files), under src/layerscope/,
#: and the test files that exercise it. A mutant runs against these only.
TESTS: dict[str, list[str]] = {
    "flops/formulas.py": [
        # The fast, targeted file first: --recheck stops at a module's first failing test.
        "tests/test_mutants_formulas.py",
        "tests/test_flops_formulas.py",
        "tests/test_attention_flops.py",
        "tests/test_flops_meta.py",
        # tests/test_flops_agreement.py (FlopCounterMode on whole models) is left out: a
        # minute for its fast tier alone, too slow to run per mutant.
    ],
    "convert/device.py": [
        "tests/test_device_steps.py",
        "tests/test_kineto.py",
        "tests/test_reads_agree.py",
        "tests/test_mutants_device.py",
    ],
    "attribute/walk.py": [
        "tests/test_walk.py",
        "tests/test_device_steps.py",
        "tests/test_steps.py",
        # tests/test_light_steps.py and tests/test_unknown_params.py also reach walk.py, but
        # through whole captures: seconds per mutant, and most mutants then time out.
    ],
    "base/stats.py": ["tests/test_mutants_stats.py", "tests/test_stats.py"],
    "base/kineto_json.py": ["tests/test_kineto.py", "tests/test_traces.py"],
    "model/diff.py": ["tests/test_diff.py"],
    "model/check.py": ["tests/test_traces.py", "tests/test_unknown_params.py"],
}

DEFAULT_MODULES = ["flops/formulas.py", "convert/device.py", "attribute/walk.py", "base/stats.py"]

#: Survivors that cannot change behaviour, by mutmut's name, with the reason. They are
#: counted apart and left out of the score.
EQUIVALENT: dict[str, str] = {
    "layerscope.convert.device.x__covered__mutmut_11": (
        "`spans[at][0] <= end` for `< end`: a span that starts at `end` adds max(0, end - end) = 0"
    ),
    "layerscope.convert.device.x__covered__mutmut_18": (
        "`max(1, ...)` for `max(0, ...)`: the spans visited overlap [start, end) by at least 1 ns "
        "(integer times; their end > start by bisect, their start < end by the loop)"
    ),
    "layerscope.convert.device.x_share_device_time__mutmut_79": (
        "`end >= begin` for `end > begin` among collectives: an empty stretch adds 0 to comm and "
        "0 - _covered(begin, begin) = 0 to comm alone"
    ),
    # flops/formulas.py. A default that only applies when an argument is absent, for an
    # argument the op's schema requires (so every call passes it):
    **{
        f"layerscope.flops.formulas.x_{fn}__mutmut_{n}": f"{fn}: the default of an argument the op's schema requires"
        for fn, ns in (
            ("_conv_backward_bias", (6, 11, 17)),  # output_mask
            ("_embedding_bag_backward", (10, 15, 19, 61)),  # mode, scale_grad_by_freq
            ("_batch_norm", (7, 12, 16)),  # training
        )
        for n in ns
    },
    **{
        f"layerscope.flops.formulas.x_{fn}__mutmut_{n}": why
        for fn, n, why in (
            ("_conv_backward_bias", 15, "default output_mask [True, False, False]: mask[2] is False either way"),
            ("_conv_backward_bias", 16, "default output_mask [False, True, False]: mask[2] is False either way"),
            ("_index_put", 7, "default accumulate None for False: bool(None) is False"),
            ("_index_put", 12, "default accumulate left out (None) for False: bool(None) is False"),
            ("_embedding_bag_backward", 52, "default scale_grad_by_freq None for False: both falsy"),
            ("_embedding_bag_backward", 57, "default scale_grad_by_freq left out (None) for False: both falsy"),
            ("_embedding_bag_backward", 25, "grad.shape[+1] for [-1]: grad is (bags, D), 2-D"),
            ("_scatter_add", 17, "`or True` on isinstance(source, TensorMeta): the schemas' src/source is a Tensor"),
            ("_scatter_add", 18, "0 -> 1 when source is no tensor: the schemas' src/source is a Tensor"),
            ("_softmax_on_scores", 8, "value for key in the scores: value's length (shape[-2]) is key's"),
            ("_softmax_backward_on_scores", 8, "value for key in the scores: value's length (shape[-2]) is key's"),
            ("_native_mha", 3, "value for key: only key.shape[-2] is read, and value's length is key's"),
            ("_native_mha", 45, "`bias = ...` for `bias += ...`: bias is 0 before it"),
            ("_norm_backward", 3, "input for grad_output: the norm backward ops' grad_output has the input's shape"),
        )
    },
}

#: Decorators that only register the function and return it unchanged: the scratch copy
#: moves them after the definition so that mutmut mutates the function.
REGISTRATIONS = {"register_flops"}

#: mutmut's statuses, as counted here.
_KILLED = {"killed", "caught by type check", "segfault"}


@dataclass
class Outcome:
    """One module's mutants by status."""

    module: str
    status: dict[str, str] = field(default_factory=dict)  # mutant name -> status
    seconds: float = 0.0

    def count(self, *statuses: str) -> int:
        return sum(1 for s in self.status.values() if s in statuses)

    @property
    def equivalent(self) -> int:
        return sum(1 for name, s in self.status.items() if s == "survived" and name in EQUIVALENT)

    @property
    def survived(self) -> int:
        return self.count("survived", "no tests") - self.equivalent

    @property
    def killed(self) -> int:
        return self.count(*_KILLED, "killed on recheck")

    @property
    def timeout(self) -> int:
        return self.count("timeout")

    @property
    def score(self) -> float | None:
        judged = len(self.status) - self.equivalent - self.count("skipped", "not checked", "suspicious")
        return (self.killed + self.timeout) / judged if judged else None


def source_files() -> list[str]:
    """The files to copy: what git tracks or would track under src/ and tests/."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "src", "tests", "pyproject.toml"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    return [name for name in listed if name and (ROOT / name).is_file()]


def undecorate(source: str) -> str:
    """``source`` with each top-level ``@register(...)`` definition (a decorator in
    ``REGISTRATIONS``, the only one on it) turned into a plain ``def`` and a call
    after it: the same registrations, in the same order of definitions."""
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []  # decorator first line, its last, def's last, call
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef) or len(node.decorator_list) != 1:
            continue
        decorator = node.decorator_list[0]
        if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name)):
            continue
        if decorator.func.id not in REGISTRATIONS:
            continue
        text = ast.get_source_segment(source, decorator)
        assert text is not None and decorator.end_lineno is not None and node.end_lineno is not None
        edits.append((decorator.lineno, decorator.end_lineno, node.end_lineno, f"{text}({node.name})\n"))
    for first, last, end, call in reversed(edits):
        lines[end:end] = [call]
        del lines[first - 1 : last]
    return "".join(lines)


def prepare(module: str, workdir: Path) -> Path:
    """A scratch copy of the checkout for ``module``, set up for mutmut."""
    here = workdir / module.replace("/", "_").removesuffix(".py")
    if here.exists():
        shutil.rmtree(here)
    for name in source_files():
        (here / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, here / name)
    target = Path("src/layerscope") / module
    targets = sorted(target.rglob("*.py")) if (here / target).is_dir() else [target]
    for path in targets:
        text = (here / path).read_text()
        (here / path).write_text(undecorate(text))
    tests = [t for t in TESTS[module] if (here / t).exists()]
    only = f"{target}/*" if (here / target).is_dir() else str(target)
    (here / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = src\n"
        f"only_mutate = {only}\n"
        "pytest_add_cli_args_test_selection =\n" + "".join(f"    {t}\n" for t in tests) + "pytest_add_cli_args =\n    -m\n    not slow\n    -p\n    no:cacheprovider\n"
        "use_git_change_detection = false\n"
        # A mutant is stopped after 3x its tests' clean time (+1 s), not mutmut's 15x: a
        # mutated shape can make a formula's test crawl, and on 2 cores those waits dominate.
        "timeout_multiplier = 3\n"
        # Fork each mutant from a process that only collected the tests, not from one that
        # ran them: layerscope.flops caches each formula's result per signature, and a
        # fork of the clean run would answer every mutant from that cache.
        "process_isolation = forkserver\n"
    )
    return here


def run_mutmut(here: Path, children: int, limit: float) -> None:
    """``mutmut run`` in ``here``, its output passed through; stops it after ``limit`` s."""
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)]
    try:
        subprocess.run(command, cwd=here, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        print(f"mutmut stopped after {limit:.0f} s: the mutants not run are 'not checked'", file=sys.stderr)


def read_results(here: Path) -> dict[str, str]:
    shown = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=here,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    status: dict[str, str] = {}
    for line in shown.splitlines():
        name, sep, what = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            status[name] = what
    return status


def recheck(here: Path, module: str, status: dict[str, str], limit: float, jobs: int = 1) -> None:
    """Run each survivor in a fresh interpreter against all of its module's tests,
    ``jobs`` at a time."""
    tests = [t for t in TESTS[module] if (here / t).exists()]
    names = sorted(n for n, what in status.items() if what in ("survived", "no tests") and n not in EQUIVALENT)

    def one(name: str) -> str | None:
        env = dict(os.environ, PYTHONPATH=str(here / "mutants" / "src"), MUTANT_UNDER_TEST=name)
        # The first file alone, then the rest: most rechecked mutants fail in the first
        # (the module's targeted tests), without collecting the others.
        for chosen in ([tests[0]], tests[1:]) if len(tests) > 1 else (tests,):
            command = [sys.executable, "-m", "pytest", "-x", "-q", "-m", "not slow", "-p", "no:cacheprovider", *chosen]
            try:
                done = subprocess.run(command, cwd=here / "mutants", env=env, capture_output=True, timeout=limit)
            except subprocess.TimeoutExpired:
                return "timeout"
            if done.returncode == 1:
                return "killed on recheck"
            if done.returncode not in (0, 5):
                raise RuntimeError(f"{name}: pytest exited {done.returncode}\n{done.stdout.decode()[-2000:]}")
        return None

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for name, found in zip(names, pool.map(one, names)):
            if found is not None:
                status[name] = found


def show(here: Path, names: list[str]) -> None:
    for name in names:
        subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=here, check=False)


def table(outcomes: list[Outcome]) -> str:
    rows = ["| module | mutants | killed | survived | timeout | equivalent | score | time |", "|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        score = "n/a" if o.score is None else f"{100 * o.score:.1f}%"
        rows.append(
            f"| {o.module} | {len(o.status)} | {o.killed} | {o.survived} | {o.timeout} | {o.equivalent} | {score} | {o.seconds:.0f} s |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Targets and their tests:\n"
        + "\n".join(f"  {m}: {' '.join(t)}" for m, t in TESTS.items())
        + "\n\nThe score is (killed + timeout) / (mutants - equivalent); see docs/testing.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--modules",
        default=",".join(DEFAULT_MODULES),
        help="comma-separated targets under src/layerscope/, keys of TESTS (default: %(default)s; 'all' for every one)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "layerscope-mutation",
        help="where the scratch copies and mutmut's mutants/ go (default: %(default)s); never the checkout",
    )
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2, help="mutants run at once (default: the CPU count)")
    parser.add_argument("--limit", type=float, default=3600.0, help="seconds one module's mutmut run may take; the rest stay 'not checked'")
    parser.add_argument("--recheck", action="store_true", help="run each survivor again in a fresh interpreter (import-time code)")
    parser.add_argument("--reuse", action="store_true", help="read the results of the last run in --workdir; run nothing")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="take every mutant's status from an earlier --json file (rechecks included); run nothing",
    )
    parser.add_argument("--recheck-limit", type=float, default=300.0, help="seconds one recheck may take before it counts as a timeout")
    parser.add_argument("--show-survivors", action="store_true", help="print the diff of each survivor (mutmut show)")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="scores to compare with (default: %(default)s)")
    parser.add_argument("--write-baseline", action="store_true", help="record this run's scores in --baseline")
    parser.add_argument("--json", type=Path, help="also write every mutant's status, by module, to this file")
    parser.add_argument("--list", action="store_true", help="print the targets and their tests, and stop")
    args = parser.parse_args(argv)

    if args.list:
        for m, t in TESTS.items():
            print(f"{m}: {' '.join(t)}")
        return 0
    modules = list(TESTS) if args.modules == "all" else [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = [m for m in modules if m not in TESTS]
    if unknown:
        parser.error(f"no tests declared for {', '.join(unknown)}; known: {', '.join(TESTS)}")
    if args.workdir.resolve().is_relative_to(ROOT):
        parser.error("--workdir must lie outside the checkout")

    outcomes: list[Outcome] = []
    for module in modules:
        started = time.monotonic()
        if args.from_json:
            status = json.loads(args.from_json.read_text())[module]
            outcome = Outcome(module, status)
            outcomes.append(outcome)
            left = sorted(n for n, s in status.items() if s in ("survived", "no tests") and n not in EQUIVALENT)
            print(f"{module}: {len(left)} survived", *left, sep="\n  ", flush=True)
            continue
        if args.reuse:
            here = args.workdir / module.replace("/", "_").removesuffix(".py")
        else:
            here = prepare(module, args.workdir)
            print(f"== {module}: mutmut in {here}", flush=True)
            run_mutmut(here, args.max_children, args.limit)
        status = read_results(here)
        if args.recheck:
            recheck(here, module, status, args.recheck_limit, args.max_children)
        outcome = Outcome(module, status, time.monotonic() - started)
        outcomes.append(outcome)
        left = sorted(n for n, s in status.items() if s in ("survived", "no tests") and n not in EQUIVALENT)
        print(f"{module}: {len(left)} survived", *left, sep="\n  ", flush=True)
        if args.show_survivors:
            show(here, left)

    print()
    print(table(outcomes))
    if args.json:
        args.json.write_text(json.dumps({o.module: o.status for o in outcomes}, indent=1, sort_keys=True))

    recorded = json.loads(args.baseline.read_text()) if args.baseline.exists() else {}
    fell = [o for o in outcomes if o.score is not None and o.module in recorded and o.score < recorded[o.module] - 1e-9]
    for o in fell:
        print(f"score fell: {o.module} {100 * recorded[o.module]:.1f}% -> {100 * (o.score or 0):.1f}%")
    if args.write_baseline:
        recorded.update({o.module: round(o.score, 4) for o in outcomes if o.score is not None})
        args.baseline.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    return 1 if fell else 0


if __name__ == "__main__":
    sys.exit(main())
