"""The ``layerscope`` command line, each run a process of its own (``python -m layerscope``,
forked from a warm interpreter: ``processes.py``).

Each run imports torch (a few seconds on a small machine), so runs are shared between
tests where they can be, and timing-irrelevant runs use ``--repeat 1 --warmup 0``.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import layerscope
import layerscope.base.io
from conftest import FULL_DEVICE, NULL_DEVICE
from processes import Done, run_layerscope

FAST = ("--repeat", "1", "--warmup", "0")
ZOO_NAMES = ["alexnet", "gpt", "lenet5", "mlp", "resnet18", "resnet50", "vit_b_16"]

NETS_PY = """\
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x, scale=1.0):
        return self.fc(x) * scale


class Boom(nn.Module):
    def forward(self, x):
        raise ValueError("boom from forward")


def build():
    return Tiny()


def build_scaled():
    return Scaled()


def build_boom():
    return Boom()


def not_a_module():
    return 42


def make_inputs():
    return {"x": torch.ones(3, 8), "scale": 2.0}
"""


#: A finished command: its exit code, stdout and stderr.
Run = Done


def run_cli(*args: str, cwd: Path, pythonpath: Path | None = None, stdout: Path | None = None) -> Run:
    """Run ``python -m layerscope ARGS`` as a process of its own (forked from a warm
    interpreter: ``processes.py``); its stdout is captured, or goes to the file
    ``stdout`` (then ``Run.stdout`` is empty)."""
    env = dict(os.environ)
    # transformers: SPECs build from default configs; nothing may be downloaded.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return run_layerscope(list(args), cwd, env=env, stdout=stdout)


def assert_usage_error(run: Run) -> str:
    """Exit 2, nothing on stdout, one ``layerscope: error:`` line on stderr; returns it."""
    assert run.returncode == 2, run
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("layerscope: error: ")
    return lines[0]


def module_rows(text: str) -> list[str]:
    """The first cell (tree prefix and name) of every table row."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Module "))
    rows = []
    for line in lines[start + 2 :]:
        if not line:
            break
        rows.append(line.split(" | ")[0].rstrip())
    return rows


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    (folder / "nets.py").write_text(NETS_PY, encoding="utf-8")
    return folder


# -- the process each command runs in ---------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["flops", "zoo:mlp", "--depth", "1"],  # torch, its fake tensors and a model: stdout
        ["profile", "nets.py:build_boom", "--input", "2x8", *FAST],  # the model raises: exit 1, stderr
        ["profile", "zoo:nope"],  # a usage error: exit 2
        ["--help"],
    ],
    ids=["flops", "model-raises", "usage-error", "help"],
)
@pytest.mark.slow  # each starts a cold interpreter
def test_a_command_forked_warm_reads_as_a_cold_python_m_layerscope(args: list[str], workdir: Path) -> None:
    """The suite forks its commands from a warm interpreter (``processes.py``); the same
    command started cold, as a user's shell starts it, gives the same exit code, stdout
    and stderr."""
    warm = run_layerscope(args, workdir, warm=True)
    cold = run_layerscope(args, workdir, warm=False)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert warm.returncode == {"flops": 0, "profile": 1 if "nets.py:build_boom" in args else 2, "--help": 0}[args[0]]


# -- demo, zoo, help ------------------------------------------------------------------


def test_demo_prints_the_resnet_tree(workdir: Path) -> None:
    run = run_cli("demo", *FAST, cwd=workdir)
    assert run.returncode == 0, run.stderr
    rows = module_rows(run.stdout)
    assert rows[0] == "ResNet"
    assert "├── layer1" in rows
    assert "│   ├── 0" in rows  # layer1.0, a BasicBlock at depth 2
    # The demo stops at depth 2: layer1.0.conv1 (depth 3) is not drawn.
    assert not any(row.startswith("│   │   ") for row in rows)
    assert "Params: 11.69M" in run.stdout
    assert "USDT" not in run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr == ""


def test_zoo_lists_every_model(workdir: Path) -> None:
    run = run_cli("zoo", cwd=workdir)
    assert run.returncode == 0, run.stderr
    listed = [line.split()[0] for line in run.stdout.splitlines()]
    assert listed == [f"zoo:{name}" for name in ZOO_NAMES]
    assert "61.7K params" in run.stdout  # lenet5's description comes along


def test_help_mentions_spec_forms_and_examples(workdir: Path) -> None:
    for args in (("--help",), ("profile", "--help")):
        run = run_cli(*args, cwd=workdir)
        assert run.returncode == 0, run.stderr
        for form in (
            "zoo:NAME",
            "transformers:ClassName",
            "package.module:callable",
            "path/to/file.py:callable",
        ):
            assert form in run.stdout, (args, form)
        assert "examples:" in run.stdout
        assert "layerscope profile zoo:alexnet --depth 2" in run.stdout
    assert "--inputs SPEC" in run.stdout and "--show-ops" in run.stdout


def test_no_arguments_is_a_usage_error(workdir: Path) -> None:
    run = run_cli(cwd=workdir)
    assert run.returncode == 2
    assert "usage: layerscope" in run.stdout + run.stderr
    assert "Traceback" not in run.stderr


# -- profiling built-in models --------------------------------------------------------


def test_profile_zoo_model_full_tree(workdir: Path) -> None:
    run = run_cli("profile", "zoo:lenet5", "--repeat", "2", "--warmup", "1", cwd=workdir)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # quiet: no progress bar when stderr is not a terminal
    assert run.stdout.startswith("LeNet5  ·  cpu  ·  float32  ·  ")
    assert "2 passes after 1 warm-up" in run.stdout.splitlines()[0]
    rows = module_rows(run.stdout)
    assert rows[:3] == ["LeNet5", "├── features", "│   ├── 0"]
    assert rows[-1] == "    └── 4"
    assert len(rows) == 1 + 2 + 6 + 5
    assert "aten::" not in run.stdout
    assert "Whole forward over 2 passes:" in run.stdout
    assert "Params: 61.71K" in run.stdout


def test_profile_depth_1(workdir: Path) -> None:
    run = run_cli("profile", "zoo:lenet5", "--depth", "1", *FAST, cwd=workdir)
    assert run.returncode == 0, run.stderr
    assert module_rows(run.stdout) == ["LeNet5", "├── features", "└── classifier"]
    assert "Params: 61.71K" in run.stdout  # hidden rows still count


def test_profile_show_ops(workdir: Path) -> None:
    run = run_cli("profile", "zoo:lenet5", "--show-ops", *FAST, cwd=workdir)
    assert run.returncode == 0, run.stderr
    rows = module_rows(run.stdout)
    ops = [row.lstrip("│├└─ ") for row in rows if "aten::" in row]
    assert "aten::convolution" in ops and "aten::addmm" in ops and "aten::view" in ops
    # Ops nest under their module: aten::convolution right after features.0.
    conv = rows.index("│   ├── 0")
    assert rows[conv + 1].lstrip("│ ").startswith("aten::")
    assert "Input shapes" in run.stdout.splitlines()[2]
    assert "[1, 1, 32, 32]" in run.stdout


def test_profile_json_to_stdout(workdir: Path) -> None:
    run = run_cli("profile", "zoo:lenet5", "--format", "json", *FAST, cwd=workdir)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["schema"] == "layerscope/1"
    assert doc["meta"]["spec"] == "zoo:lenet5"
    assert doc["totals"]["params"] == 61_706  # 156 + 2416 + 48120 + 10164 + 850
    assert [m["path"] for m in doc["modules"]][:3] == ["", "features", "features.0"]


@pytest.fixture(scope="module")
def json_output(workdir: Path) -> tuple[Run, Path]:
    folder = workdir / "json-out"
    folder.mkdir()
    return run_cli("profile", "zoo:lenet5", *FAST, "-o", "out.json", cwd=folder), folder / "out.json"


def test_output_file_format_from_extension(json_output: tuple[Run, Path]) -> None:
    run, path = json_output
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    assert "wrote json to out.json" in run.stderr
    loaded = layerscope.load(str(path))
    assert loaded.root.type == "LeNet5"
    assert loaded.root.params_total == 61_706
    assert loaded["classifier.4"].params == 850
    assert loaded.meta.spec == "zoo:lenet5"
    # Written atomically: no temporary file is left next to it.
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.json"]


def test_output_file_gets_ordinary_permissions(json_output: tuple[Run, Path]) -> None:
    # A profile is an ordinary file: readable as any file the user creates (umask),
    # not the 0600 of the temporary file it was written through.
    run, path = json_output
    assert run.returncode == 0, run.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~umask)


def test_output_txt_is_text(workdir: Path) -> None:
    folder = workdir / "txt-out"
    folder.mkdir()
    run = run_cli("profile", "zoo:lenet5", *FAST, "-o", "out.txt", cwd=folder)
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    text = (folder / "out.txt").read_text(encoding="utf-8")
    assert text.startswith("LeNet5  ·  cpu")
    assert module_rows(text)[:2] == ["LeNet5", "├── features"]


# -- user models: file, package and inputs SPECs -------------------------------------


def test_profile_model_from_a_file(workdir: Path) -> None:
    spec = f"{workdir / 'nets.py'}:build"  # path/to/file.py:callable, absolute
    run = run_cli("profile", spec, "--input", "2x8", *FAST, "--show-ops", cwd=workdir.parent)
    assert run.returncode == 0, run.stderr
    assert module_rows(run.stdout)[:2] == ["Tiny", "└── fc"]
    assert "[[2, 8]]" in run.stdout
    assert "Params: 36 (144 B)" in run.stdout  # 8*4 + 4


def test_inputs_callable_returning_keyword_arguments(workdir: Path) -> None:
    run = run_cli(
        "profile",
        "nets.py:build_scaled",
        "--inputs",
        "nets.py:make_inputs",
        "--show-ops",
        *FAST,
        cwd=workdir,
    )
    assert run.returncode == 0, run.stderr
    assert module_rows(run.stdout)[0] == "Scaled"
    assert "[[3, 8]]" in run.stdout  # fc saw the batch of 3 from make_inputs
    assert "aten::mul" in run.stdout  # the scale keyword reached forward


def test_package_module_callable(tmp_path: Path) -> None:
    site = tmp_path / "site"
    package = site / "ls_test_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "nets.py").write_text(NETS_PY, encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"  # not the cwd: the import must go through PYTHONPATH
    elsewhere.mkdir()
    run = run_cli(
        "profile", "ls_test_models.nets:build", "--input", "1x8", *FAST, cwd=elsewhere, pythonpath=site
    )
    assert run.returncode == 0, run.stderr
    assert module_rows(run.stdout)[:2] == ["Tiny", "└── fc"]


# -- transformers ---------------------------------------------------------------------


def test_transformers_unknown_class(workdir: Path) -> None:
    line = assert_usage_error(run_cli("profile", "transformers:NoSuchModel", cwd=workdir))
    assert "'NoSuchModel'" in line


def test_transformers_model_from_default_config(workdir: Path) -> None:
    # GPT2Model's default config (124M params) costs about 6 s here: one run, lean flags.
    pytest.importorskip("transformers")
    run = run_cli("profile", "transformers:GPT2Model", "--no-ops", "--depth", "1", *FAST, cwd=workdir)
    assert run.returncode == 0, run.stderr
    rows = module_rows(run.stdout)
    assert rows[0] == "GPT2Model"
    assert "├── h" in rows and "├── wte" in rows
    assert "Params: 124.44M" in run.stdout


# -- inputs: token ids, what transformers models need, the header ---------------------

TINY_TRANSFORMERS_PY = """\
import torch
import transformers as T


def bert():
    return T.BertModel(T.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
    ))


def t5():
    return T.T5Model(T.T5Config(vocab_size=60, d_model=32, d_ff=64, d_kv=16, num_layers=1, num_heads=2))


def clip():
    return T.CLIPModel(T.CLIPConfig(
        text_config=dict(
            vocab_size=70, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=20,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            image_size=32, patch_size=8,
        ),
    ))


def embedding_only():
    return torch.nn.Sequential(torch.nn.Embedding(30, 8), torch.nn.Linear(8, 2))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file of tiny transformers models (vocabularies under 100), for file SPECs."""
    pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny") / "tiny_transformers.py"
    path.write_text(TINY_TRANSFORMERS_PY, encoding="utf-8")
    return path


def run_main(*args: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """The CLI in this process (no torch import per run): exit status, stdout, stderr."""
    from layerscope.cli import main

    status = main(list(args))
    captured = capsys.readouterr()
    return Run(status, captured.out, captured.err)


def header(text: str) -> str:
    return text.splitlines()[0]


@pytest.mark.parametrize("command", [("flops",), ("profile", *FAST)], ids=["flops", "profile"])
@pytest.mark.parametrize("name", ["bert", "embedding_only"])
def test_int64_inputs_are_token_ids_below_the_vocabulary(
    tiny: Path, name: str, command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    # Vocabularies of 50 (config.vocab_size) and 30 (the first nn.Embedding): ids drawn
    # from 0-99 would index out of range.
    run = run_main(*command, f"{tiny}:{name}", "--input", "2x16:int64", "--depth", "0", capsys=capsys)
    assert run.returncode == 0, run.stderr
    assert "  ·  input [2, 16] int64  ·  " in header(run.stdout)


def test_token_ids_are_drawn_below_the_vocabulary(tiny: Path) -> None:
    import torch

    from layerscope.zoo.specs import DEFAULT_INT_LIMIT, resolve_model, tensor_for, vocab_size

    models = {name: resolve_model(f"{tiny}:{name}").model for name in ("bert", "t5", "clip", "embedding_only")}
    assert {name: vocab_size(model) for name, model in models.items()} == {
        "bert": 50, "t5": 60, "clip": 70, "embedding_only": 30,
    }
    assert vocab_size(torch.nn.Linear(2, 2)) is None
    ids = tensor_for((64, 64), torch.int64, torch.Generator().manual_seed(0), int_limit=50)
    assert 0 <= int(ids.min()) and int(ids.max()) == 49
    assert int(tensor_for((64, 64), torch.int32, torch.Generator().manual_seed(0)).max()) == DEFAULT_INT_LIMIT - 1


def test_encoder_decoder_and_dual_encoder_get_the_inputs_they_need(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # T5 needs decoder_input_ids too; CLIP encodes text and an image of its vision
    # config's size, its text no longer than its 20 positions.
    t5 = run_main("flops", f"{tiny}:t5", "--depth", "0", capsys=capsys)
    assert t5.returncode == 0, t5.stderr
    assert "  ·  inputs input_ids [1, 128] int64, decoder_input_ids [1, 128] int64  ·  " in header(t5.stdout)
    clip = run_main("profile", f"{tiny}:clip", "--batch-size", "2", "--depth", "0", *FAST, capsys=capsys)
    assert clip.returncode == 0, clip.stderr
    assert "  ·  inputs input_ids [2, 20] int64, pixel_values [2, 3, 32, 32] float32  ·  " in header(clip.stdout)


def test_default_inputs_follow_the_config(tiny: Path) -> None:
    import torch
    import transformers as T

    from layerscope.base.errors import SpecError
    from layerscope.zoo.specs import default_transformers_inputs, resolve_model

    def described(model: torch.nn.Module, batch_size: int = 1) -> dict[str, Any]:
        inputs = default_transformers_inputs(model, batch_size)
        model(**inputs)  # they run
        return {name: (list(t.shape), str(t.dtype), int(t.max())) for name, t in inputs.items()}

    t5 = described(resolve_model(f"{tiny}:t5").model, 2)
    assert t5 == {"input_ids": ([2, 128], "torch.int64", 59), "decoder_input_ids": ([2, 128], "torch.int64", 59)}
    assert described(resolve_model(f"{tiny}:clip").model)["pixel_values"][0] == [1, 3, 32, 32]
    small = {"d_model": 32, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "encoder_attention_heads": 2,
             "decoder_attention_heads": 2, "encoder_layers": 1, "decoder_layers": 1}
    bart = described(T.BartModel(T.BartConfig(vocab_size=40, max_position_embeddings=64, **small)))
    assert bart == {"input_ids": ([1, 64], "torch.int64", 39), "decoder_input_ids": ([1, 64], "torch.int64", 39)}
    vit = T.ViTModel(T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                 image_size=16, patch_size=8, num_channels=1))
    assert described(vit) == {"pixel_values": ([1, 1, 16, 16], "torch.float32", 0)}
    whisper = T.WhisperModel(T.WhisperConfig(num_mel_bins=8, max_source_positions=16, **small))
    with pytest.raises(SpecError, match=r"WhisperModel \(its main input is 'input_features'; forward takes input_features"):
        default_transformers_inputs(whisper, 1)


def test_a_transformers_model_that_raises_says_what_it_takes(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One positional tensor is T5's input_ids only; its own error names neither input.
    run = run_main("flops", f"{tiny}:t5", "--input", "1x8:int64", capsys=capsys)
    assert run.returncode == 1
    (line,) = run.stderr.splitlines()  # one line: the error, where, and what the model takes
    # Which module raised (the decoder: it has no input ids), and what the model takes.
    assert line.startswith("layerscope: error: the model raised ValueError in module 'decoder' (T5Stack): ")
    hint = line[line.index("; T5Model.forward takes"):]
    assert hint.startswith("; T5Model.forward takes input_ids, attention_mask, decoder_input_ids, ")
    assert "it was given (Tensor[1, 8]:int64)" in hint
    assert "without --input/--inputs layerscope builds input_ids, decoder_input_ids" in hint
    assert hint.endswith("pass --inputs SPEC naming a callable that returns what it needs as a dict [--debug: the traceback]")


def test_header_says_autocast_and_its_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    plain = run_main("profile", "zoo:mlp", *FAST, "--depth", "0", capsys=capsys)
    assert header(plain.stdout) == "MLP  ·  cpu  ·  float32  ·  input [1, 64] float32  ·  1 measured pass after 0 warm-up"
    amp = run_main("profile", "zoo:mlp", "--autocast", "bfloat16", *FAST, "--depth", "0", capsys=capsys)
    assert amp.returncode == 0, amp.stderr
    assert header(amp.stdout) == (
        "MLP  ·  cpu  ·  float32  ·  autocast bfloat16  ·  input [1, 64] float32  ·  1 measured pass after 0 warm-up"
    )
    counted = run_main("flops", "zoo:mlp", "--autocast", "bf16", "--format", "json", capsys=capsys)
    assert json.loads(counted.stdout)["meta"]["autocast"] == "bfloat16"
    line = assert_usage_error(run_main("flops", "zoo:mlp", "--device", "meta", "--autocast", "bfloat16", capsys=capsys))
    assert "--autocast on meta" in line


# -- usage errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(("zoo:nope",), ["'nope'", *ZOO_NAMES], id="unknown-zoo-name"),
        pytest.param(("zoo:lenet5", "--input", "3xfoo"), ["'3xfoo'", "1x3x224x224"], id="bad-shape"),
        pytest.param(("zoo:lenet5", "--input", "8x"), ["'8x'", "1x3x224x224"], id="shape-with-a-missing-size"),
        pytest.param(("zoo:lenet5", "--input", "8xx3"), ["'8xx3'"], id="shape-with-an-empty-size"),
        pytest.param(("zoo:lenet5", "--input", "8x3:"), ["'8x3:'"], id="shape-with-an-empty-dtype"),
        pytest.param(("lenet5",), ["'lenet5'", "zoo:NAME"], id="spec-without-colon"),
        pytest.param(("missing.py:build",), ["no such file", "'missing.py'"], id="missing-file"),
        pytest.param(("nets.py:not_a_module",), ["int", "torch.nn.Module"], id="not-a-module"),
        pytest.param(
            ("nets.py:build", "--input", "2x8", "--inputs", "nets.py:make_inputs"),
            ["not both"],
            id="input-and-inputs",
        ),
        pytest.param(("nets.py:build",), ["--input SHAPE"], id="no-default-input"),
        pytest.param(("zoo:mlp", "--compile", "--format", "chrome"), ["keeps no trace"], id="compile-no-trace"),
        pytest.param(
            ("zoo:lenet5", "--input", "1x1x32x32", "--input", "3"),
            ["LeNet5.forward(x", "too many"],
            id="inputs-do-not-fit-forward",
        ),
    ],
)
def test_usage_errors(workdir: Path, args: tuple[str, ...], expected: list[str]) -> None:
    line = assert_usage_error(run_cli("profile", *args, *FAST, cwd=workdir))
    for fragment in expected:
        assert fragment in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("profile", "zoo:mlp", "--repeat", "0"), "argument --repeat: expected a number >= 1, got 0"),
        (("profile", "zoo:mlp", "--batch-size", "0"), "argument --batch-size: expected a number >= 1, got 0"),
        (("flops", "zoo:mlp", "--batch-size", "0"), "argument --batch-size: expected a number >= 1, got 0"),
        (("bench", "zoo:mlp", "--batch-sizes", "1", "0"), "argument --batch-sizes: expected a number >= 1, got 0"),
        (("bench", "zoo:mlp", "--min-runs", "0"), "argument --min-runs: expected a number >= 1, got 0"),
        (("bench", "zoo:mlp", "--min-time", "-1"), "argument --min-time: expected a number of seconds >= 0"),
        (("profile", "zoo:mlp", "--depth", "x"), "argument --depth: expected a whole number, got 'x'"),
        (("profile", "zoo:mlp", "--sort-by", "speed"), "argument --sort-by: unknown sort_by key 'speed'"),
        (("show", "x.json", "--group-by", "layer"), "argument --group-by: unknown group_by key 'layer'"),
        (("profile", "zoo:mlp", "--columns", "flops,nope"), "argument --columns: unknown column 'nope'"),
        (("profile",), "the following arguments are required: SPEC"),
        (("nope",), "argument COMMAND: invalid choice: 'nope'"),
    ],
)
def test_option_errors_are_one_line(args: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from layerscope.cli import main

    with pytest.raises(SystemExit) as excinfo:
        main(list(args))
    assert excinfo.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    command = "layerscope" if args[0] == "nope" else f"layerscope {args[0]}"
    assert line.startswith(f"{command}: error: {says}")
    assert line.endswith(f"; see '{command} --help'")


def test_a_model_built_on_the_meta_device_is_not_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from layerscope.cli import main

    (tmp_path / "meta_nets.py").write_text(
        "import torch\n\ndef build():\n    with torch.device('meta'):\n        return torch.nn.Linear(8, 4)\n",
        encoding="utf-8",
    )
    spec = f"{tmp_path / 'meta_nets.py'}:build"
    assert main(["profile", spec, "--input", "2x8"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "meta device" in line and "layerscope flops" in line
    assert main(["flops", spec, "--input", "2x8", "--device", "meta"]) == 0  # counting works there


def test_cuda_on_a_cpu_machine(workdir: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = assert_usage_error(run_cli("profile", "zoo:lenet5", "--device", "cuda", *FAST, cwd=workdir))
    assert "CUDA" in line


# -- failures while running -----------------------------------------------------------


def test_model_that_raises_keeps_an_existing_output(tmp_path: Path, workdir: Path) -> None:
    target = tmp_path / "keep.json"
    target.write_text("the previous profile\n", encoding="utf-8")
    run = run_cli(
        "profile",
        f"{workdir / 'nets.py'}:build_boom",
        "--input",
        "2x8",
        *FAST,
        "-o",
        str(target),
        cwd=tmp_path,
    )
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr == (
        "layerscope: error: the model raised ValueError in the model's own forward (Boom): boom from forward "
        "[--debug: the traceback]\n"
    )
    assert "Traceback" not in run.stderr
    assert target.read_text(encoding="utf-8") == "the previous profile\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]  # no temp file left


def test_debug_shows_the_traceback(workdir: Path) -> None:
    run = run_cli("profile", "nets.py:build_boom", "--input", "2x8", *FAST, "--debug", cwd=workdir)
    assert run.returncode == 1
    assert "Traceback (most recent call last)" in run.stderr
    assert 'raise ValueError("boom from forward")' in run.stderr  # the user's own line
    # The exception as raised, the note saying which module raised it (the root here),
    # then the error's one line.
    assert run.stderr.rstrip().splitlines()[-3:] == [
        "ValueError: boom from forward",
        "layerscope: raised in module '(the model)' (Boom)",
        "layerscope: error: the model raised ValueError in the model's own forward (Boom): boom from forward",
    ]


def test_unwritable_output_path(workdir: Path) -> None:
    run = run_cli("profile", "zoo:lenet5", *FAST, "-o", "/nonexistent-dir/x.json", cwd=workdir)
    assert run.returncode != 0
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("layerscope: error: cannot write '/nonexistent-dir/x.json'")
    assert "'/nonexistent-dir'" in lines[0] and "does not exist" in lines[0]
    # Said once: the CLI's prefix and io.write_atomic's message must not both say it.
    assert lines[0].count("cannot write") == 1, lines[0]


def test_output_to_a_device_writes_through_it(char_device: Any, tmp_path: Path) -> None:
    null = char_device("null", NULL_DEVICE)
    run = run_cli("profile", "zoo:mlp", *FAST, "-o", str(null), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert stat.S_ISCHR(os.stat(null).st_mode), "the device was replaced by a regular file"
    assert run.stderr == f"layerscope: wrote text to {null}\n"


def test_profile_backward_writes_both_phases_and_the_step(tmp_path: Path) -> None:
    out = tmp_path / "mlp.json"
    run = run_cli("profile", "zoo:mlp", "--backward", *FAST, "-o", str(out), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    prof = layerscope.load(out)
    assert prof.has_backward
    assert prof["layers.0"].backward.macs > 0
    assert [p.path for p in prof.parts] == ["<loss>", "<layerscope>", "<other>"]
    assert prof.step_time_ns == sum(
        stats.self_cpu_time_ns for node in prof.nodes() for _, stats in node.phases()
    )


def test_flops_backward_counts_both_phases(tmp_path: Path) -> None:
    run = run_cli("flops", "zoo:mlp", "--backward", "--format", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    root = doc["modules"][0]
    # zoo:mlp is Linear 64->256->256->10 at batch 1:
    #   forward  64*256 + 256*256 + 256*10             =  84,480 MACs
    #   backward 64*256 (first layer: weight gradient only, its input needs none)
    #            + 2*256*256 + 2*256*10                 = 152,576 MACs
    assert root["forward"]["macs"] == 84_480
    assert root["backward"]["macs"] == 152_576
    assert doc["meta"]["timed"] is False and doc["totals"]["step_time_ns"] is None


# -- failures to write the output -----------------------------------------------------


def assert_write_error(run: Run, destination: str) -> None:
    """Exit 4 and one line naming where the output was going and the system's error."""
    assert run.returncode == 4, run
    assert run.stderr == f"layerscope: error: cannot write {destination}: No space left on device\n"


@pytest.fixture(scope="module")
def saved_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from layerscope import zoo

    entry = zoo.get("lenet5")
    path = tmp_path_factory.mktemp("saved") / "lenet5.json"
    layerscope.profile(entry.build(), entry.example_inputs(1), warmup=0, repeat=1).save(path)
    return path


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("profile", "zoo:mlp", *FAST), id="profile"),
        pytest.param(("show", "{saved}"), id="show"),
        pytest.param(("diff", "{saved}", "{saved}"), id="diff"),
        pytest.param(("zoo",), id="zoo"),
        pytest.param(("--help",), id="help"),
    ],
)
def test_a_full_stdout_is_one_line_and_exit_4(
    args: tuple[str, ...], char_device: Any, saved_profile: Path, tmp_path: Path
) -> None:
    full = char_device("full", FULL_DEVICE)
    argv = [arg.format(saved=saved_profile) for arg in args]
    assert_write_error(run_cli(*argv, cwd=tmp_path, stdout=full), "stdout")


def test_a_reader_that_stops_early_ends_the_output_quietly(
    saved_profile: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `layerscope show ... | head`: the reader closed the pipe, so writing stdout fails
    # with EPIPE. (Pipes in this sandbox never report EPIPE, so the failure is raised by
    # the stream itself, as the OS would.)
    from layerscope.cli import main

    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["show", str(saved_profile)]) == 0
    assert capsys.readouterr().err == ""


def test_a_full_output_file_is_one_line_and_exit_4(char_device: Any, saved_profile: Path, tmp_path: Path) -> None:
    full = char_device("full", FULL_DEVICE)
    assert_write_error(run_cli("profile", "zoo:mlp", *FAST, "-o", str(full), cwd=tmp_path), repr(str(full)))
    assert stat.S_ISCHR(os.stat(full).st_mode)


@pytest.mark.parametrize(
    "args", [("show", "{saved}"), ("diff", "{saved}", "{saved}")], ids=["show", "diff"]
)
def test_a_failed_file_write_keeps_the_old_file(
    args: tuple[str, ...], saved_profile: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The disk fills while the new file is flushed: the old one stays whole, no temp file.
    from layerscope.cli import main

    target = tmp_path / "out.txt"
    target.write_text("the old report\n", encoding="utf-8")

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(layerscope.base.io.os, "fsync", full_disk)
    status = main([arg.format(saved=saved_profile) for arg in args] + ["-o", str(target)])
    captured = capsys.readouterr()
    assert status == 4
    assert captured.err == f"layerscope: error: cannot write {str(target)!r}: No space left on device\n"
    assert target.read_text(encoding="utf-8") == "the old report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


# -- the terminal's width -------------------------------------------------------------


def run_on_a_terminal(*args: str, cwd: Path, columns: int) -> str:
    """Run ``python -m layerscope ARGS`` with its stdout on a pseudo-terminal ``columns``
    wide; what it printed, with the terminal's \\r\\n made \\n again."""
    import pty

    main_fd, child_fd = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns))
    process = subprocess.Popen(
        [sys.executable, "-m", "layerscope", *args], cwd=cwd, env=env, stdout=child_fd, stderr=subprocess.PIPE
    )
    os.close(child_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main_fd)
    assert process.wait(timeout=300) == 0, process.stderr.read() if process.stderr else ""
    return b"".join(chunks).decode("utf-8").replace("\r\n", "\n")


def test_a_terminal_gets_a_table_that_fits(saved_profile: Path, tmp_path: Path) -> None:
    text = run_on_a_terminal("show", str(saved_profile), cwd=tmp_path, columns=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "Hidden to fit a width of 80: " in text


def test_piped_output_keeps_the_whole_table(
    saved_profile: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from layerscope.cli import main

    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["show", str(saved_profile)]) == 0
    text = capsys.readouterr().out
    assert text == layerscope.load(saved_profile).render("text")
    assert "Hidden" not in text and max(len(line) for line in text.splitlines()) > 80


@pytest.mark.parametrize("columns", [80, 120])
def test_piped_output_honours_columns(
    saved_profile: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    """``COLUMNS=120 layerscope show run.json | less``: fitted to 120, as shutil and rich
    honour it where stdout is no terminal."""
    from layerscope.cli import main

    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["show", str(saved_profile)]) == 0
    text = capsys.readouterr().out
    assert text == layerscope.load(saved_profile).render("text", width=columns)
    assert max(len(line) for line in text.splitlines()) <= columns


def test_columns_option(saved_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from layerscope.cli import main

    assert main(["show", str(saved_profile), "--columns", "flops, self_cpu", "--depth", "0"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split(" | ") == ["Module", "  FLOPs", "Self CPU"]
    with pytest.raises(SystemExit) as excinfo:
        main(["profile", "--columns", "list"])  # no SPEC needed, as with --help
    assert excinfo.value.code == 0
    listing = capsys.readouterr().out
    assert "  self_cpu      Self CPU\n" in listing and "  fwd_self      Fwd self\n" in listing
    # A name no table has is refused before any run; one this profile lacks, after loading it.
    with pytest.raises(SystemExit):
        main(["profile", "zoo:mlp", "--columns", "self_cpu,nope"])
    assert "unknown column 'nope'" in capsys.readouterr().err
    assert main(["show", str(saved_profile), "--columns", "bwd_self"]) == 2
    assert "no column 'bwd_self'" in capsys.readouterr().err
    assert main(["show", str(saved_profile), "--columns", "flops", "--format", "csv"]) == 2
    assert "--columns: only for --format text" in capsys.readouterr().err


def test_config_overrides_size_a_transformers_model(workdir: Path) -> None:
    pytest.importorskip("transformers")
    args = ("flops", "transformers:LlamaForCausalLM", "--format", "json", "--config",
            "num_hidden_layers=2,hidden_size=64,intermediate_size=128,num_attention_heads=4,num_key_value_heads=2")
    done = run_cli(*args, cwd=workdir)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    paths = {node["path"] for node in doc["modules"]}
    assert "model.layers.1" in paths and "model.layers.2" not in paths
    q_proj = next(node for node in doc["modules"] if node["path"] == "model.layers.0.self_attn.q_proj")
    assert q_proj["params"] == 64 * 64  # head_dim follows hidden_size / heads: 16 x 4 = 64


@pytest.mark.parametrize(
    ("spec", "config", "expected"),
    [
        ("transformers:LlamaForCausalLM", "hiden_size=3", ["has no 'hiden_size'", "hidden_size"]),
        ("zoo:mlp", "hidden_size=3", ["'zoo:mlp' is not one"]),
        ("transformers:LlamaForCausalLM", "num_hidden_layers", ["is not KEY=VALUE"]),
    ],
)
def test_bad_config_is_one_line(workdir: Path, spec: str, config: str, expected: list[str]) -> None:
    pytest.importorskip("transformers")
    line = assert_usage_error(run_cli("flops", spec, "--config", config, cwd=workdir))
    assert all(fragment in line for fragment in expected), line


def test_config_errors_list_only_size_fields_and_name_the_bad_value(workdir: Path) -> None:
    pytest.importorskip("transformers")
    line = assert_usage_error(run_cli("flops", "transformers:GPT2Model", "--config", "n_layer=2,foo=1", cwd=workdir))
    prefix = "layerscope: error: --config: GPT2Model's config has no 'foo'; its size fields are "
    assert line.startswith(prefix), line
    # GPT-2's counts and dimensions; not its flags (output_hidden_states), its token ids,
    # nor chunk_size_feed_forward, which every config has and which sizes nothing.
    assert sorted(line[len(prefix):].split(", ")) == ["n_embd", "n_head", "n_layer", "n_positions", "vocab_size"]
    line = assert_usage_error(run_cli("flops", "transformers:GPT2Model", "--config", "n_layer=two", cwd=workdir))
    assert line == "layerscope: error: --config: GPT2Model's n_layer takes an int, got 'two' (a str)"


def test_size_fields_of_a_bert_config() -> None:
    transformers = pytest.importorskip("transformers")
    from layerscope.zoo.specs import size_fields

    assert sorted(size_fields(transformers.BertConfig(), transformers.PretrainedConfig())) == [
        "hidden_size", "intermediate_size", "max_position_embeddings", "num_attention_heads",
        "num_hidden_layers", "type_vocab_size", "vocab_size",
    ]  # not pad_token_id (an int, not a size), layer_norm_eps (a float), hidden_act (a string)


def test_the_module_that_raised_is_named_by_path_and_class(workdir: Path) -> None:
    (workdir / "broken.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(64, 65), torch.nn.ReLU(),\n"
        "                               torch.nn.Sequential(torch.nn.Linear(64, 256)))\n",
        encoding="utf-8",
    )
    run = run_cli("profile", "broken.py:build", "--input", "8x64", cwd=workdir)
    # The model's own sizes do not fit each other (the input, 8x64, was taken): exit 1.
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        "layerscope: error: the model raised RuntimeError in module '2.0' (Linear): mat1 and mat2 shapes cannot be "
        "multiplied (8x65 and 64x256) [--debug: the traceback]"
    ]


def test_bench_interrupted_prints_what_finished_and_exits_130(workdir: Path) -> None:
    (workdir / "stops.py").write_text(
        "import torch\n"
        "class Stops(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        if x.shape[0] == 8:\n"
        "            raise KeyboardInterrupt  # as Ctrl-C would, while batch size 8 runs\n"
        "        return self.fc(x)\n"
        "def build():\n"
        "    return Stops()\n",
        encoding="utf-8",
    )
    run = run_cli("bench", "stops.py:build", "--input", "1x4", "--batch-sizes", "1", "8", "--min-runs", "3",
                  "--min-time", "0", "-o", "partial.json", cwd=workdir)
    assert run.returncode == 130, run
    assert "    8  INTERRUPTED" in run.stdout and "best throughput: batch size 1" in run.stdout
    assert run.stderr.strip().splitlines()[-1] == "layerscope: interrupted; the batch sizes that finished are above"
    saved = json.loads((workdir / "partial.json").read_text(encoding="utf-8"))
    assert [b["status"] for b in saved["batches"]] == ["ok", "interrupted"]


@pytest.mark.parametrize("command", ["profile", "bench"])
def test_input_and_inputs_are_one_or_the_other(command: str, workdir: Path) -> None:
    # One rule for both commands, checked before any model is built.
    run = run_cli(command, "zoo:mlp", "--input", "1x64", "--inputs", "nets.py:no_such_builder", cwd=workdir)
    assert assert_usage_error(run) == "layerscope: error: give either --input SHAPE or --inputs SPEC, not both"


def test_a_bad_peak_is_the_librarys_rule_named_as_the_flag(workdir: Path) -> None:
    for command in ("profile", "show"):  # show's --peak-tflops is profile's
        line = assert_usage_error(run_cli(command, "zoo:mlp", "--peak-tflops", "-5", cwd=workdir))
        assert line == "layerscope: error: --peak-tflops must be a positive number of TFLOP/s (an H100's bf16: 989), got -5.0"
