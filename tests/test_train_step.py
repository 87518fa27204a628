"""``profile --train`` and ``session.profile_training``: whole training steps as they
train (train() mode, the optimizer's step, the model's own loss where it has one),
against ``--backward``, which keeps eval() mode; each figure worked out by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope

TINY = '''
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 4))


def inputs():
    return torch.randn(4, 8)
'''
#: The BatchNorm's and the dropout's input: 4 x 16 elements.
N = 64


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    (tmp_path / "tiny.py").write_text(TINY)
    return str(tmp_path / "tiny.py")


def _main(*args: str) -> int:
    from layerscope.cli import main

    return main(list(args))


def test_train_profiles_whole_steps_in_train_mode(tiny: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two steps summed. In train() BatchNorm computes its batch's statistics, (5 + 2
    affine) per element, and counts the batch (num_batches_tracked += 1): 7·64 + 1 a
    step; the dropout runs (bernoulli_, div_, mul on the CPU): 2·64 a step. AdamW's step
    is a part of its own, once a step."""
    out = str(tmp_path / "train.json")
    assert _main("profile", f"{tiny}:build", "--inputs", f"{tiny}:inputs", "--train", "--repeat", "2",
                 "--warmup", "1", "-o", out) == 0
    profile = layerscope.load(out)
    assert profile.render("text").splitlines()[0] == "Sequential  ·  cpu  ·  float32  ·  train mode  ·  2 steps summed"
    assert profile.meta.training is True and profile.figures.steps == 2
    assert profile["1"].forward.flops == 2 * (7 * N + 1)
    assert profile["2"].forward.flops == 2 * 2 * N
    optimizer = next(part for part in profile.parts if part.path == "<optimizer:AdamW>")
    assert optimizer.calls == 2 and profile.root.calls == 2


def test_backward_keeps_eval_mode_and_says_so(tiny: str, tmp_path: Path) -> None:
    """``--backward`` is a pass's forward and backward in eval(): BatchNorm subtracts and
    scales by its running statistics, (2 + 2 affine) per element; the dropout does
    nothing. The header says eval mode."""
    out = str(tmp_path / "backward.json")
    assert _main("profile", f"{tiny}:build", "--inputs", f"{tiny}:inputs", "--backward", "--repeat", "1",
                 "--warmup", "0", "-o", out) == 0
    profile = layerscope.load(out)
    assert "  ·  eval mode  ·  " in profile.render("text").splitlines()[0]
    assert profile["1"].forward.flops == 4 * N
    assert profile["2"].forward.flops == 0


@pytest.mark.parametrize(("flags", "said"), [
    (("--lr", "0.1"), "--lr: for a training step; add --train"),
    (("--optimizer", "sgd", "--loss", "mean"), "--optimizer, --loss: for a training step; add --train"),
    (("--train", "--backward"), "--train runs backward in each step already: drop --backward (which keeps eval() mode)"),
    (("--train", "--lr", "0"), "--lr must be a learning rate > 0, got 0"),
    (("--train", "--paths", "0"), "--paths is for profile's passes; --train records whole steps of the whole model"),
])
def test_training_flags_out_of_place_are_refused_before_any_run(
    tiny: str, flags: tuple[str, ...], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main("profile", f"{tiny}:build", "--inputs", f"{tiny}:inputs", *flags) == 2
    assert capsys.readouterr().err.strip() == f"layerscope: error: {said}"


def _gpt2() -> tuple[nn.Module, dict[str, Any]]:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config), {"input_ids": torch.randint(0, 64, (2, 8))}


def test_a_language_model_trains_on_its_own_loss_from_labels() -> None:
    """GPT-2's head computes its loss from ``labels`` (the input ids, shifted inside the
    model): the cross-entropy's ops are the model's forward, and the ``<loss>`` part
    holds no work but the loss's reading."""
    from layerscope.session import profile_training
    from layerscope.zoo.specs import training_labels

    model, inputs = _gpt2()
    labels = training_labels(model, inputs)
    assert labels is not None and torch.equal(labels["labels"], inputs["input_ids"])
    profile = profile_training(model, inputs, warmup=1, steps=1, memory=False)
    forward = {row.name for row in profile.ops(group_by="phase") if row.phase == "forward"}
    assert "aten::nll_loss_forward" in forward
    loss = [part for part in profile.parts if part.path == "<loss>"]
    assert all(op.name != "aten::sum" for part in loss for op in part.ops)


def test_a_named_loss_and_optimizer() -> None:
    """``cross_entropy`` over the output's last dimension (64 token classes, 16 rows)
    with SGD: its log-softmax runs in the ``<loss>`` part, SGD's step in its own."""
    from layerscope.session import profile_training

    model, inputs = _gpt2()
    profile = profile_training(model, inputs, optimizer="sgd", loss="cross_entropy", warmup=0, steps=1, memory=False)
    assert [part.path for part in profile.parts if part.path.startswith("<optimizer")] == ["<optimizer:SGD>"]
    loss = next(part for part in profile.parts if part.path == "<loss>")
    assert {op.name for op in loss.ops} >= {"aten::_log_softmax", "aten::nll_loss_forward"}
    with pytest.raises(ValueError, match="unknown optimizer 'lion'; expected one of: adamw, adam, sgd"):
        profile_training(model, inputs, optimizer="lion")
