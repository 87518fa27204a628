"""Trainer callbacks: Lightning's ``LayerscopeCallback`` and the Hugging Face Trainer's
``LayerscopeTrainerCallback`` on real trainers (CPU, tiny models, in-memory data).

Each run checks the cycle file (one per cycle, loadable, invariants hold, the scheduled
steps and no others), that the step's parts are there (backward, the optimizer), and
that the model is left without layerscope's hooks, including when training raises.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as nn_module

import layerscope
from layerscope.model.check import check_tree
from test_no_side_effects import GLOBAL_HOOK_DICTS, MODULE_HOOK_DICTS

pytestmark = [
    # lightning 2.6 calls torch.utils._pytree's LeafSpec check, deprecated in recent
    # torch: lightning's business, not ours.
    pytest.mark.filterwarnings("ignore:.*isinstance\\(treespec, LeafSpec\\).*"),
    # Single-process DataLoaders are deliberate: workers would only slow a tiny test.
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
]

# The module hooks checked are the forward/backward ones (a trainer may add its own
# state-dict hooks); the global ones are all of torch's.
TRAINING_HOOK_DICTS = tuple(name for name in MODULE_HOOK_DICTS if 'state_dict' not in name)


def assert_no_hooks_left(model: nn.Module) -> None:
    """No module or global hooks, no dispatch mode, and the model free for a new profiler."""
    for path, module in model.named_modules():
        for name in TRAINING_HOOK_DICTS:
            assert not getattr(module, name), f"{name} left on {path or type(model).__name__!r}"
    for name in GLOBAL_HOOK_DICTS:
        assert not getattr(nn_module, name), f"torch.nn.modules.module.{name} not empty"
    assert torch._C._len_torch_dispatch_stack() == 0
    # The profiler's claim on the model is released: profiling it again works.
    with layerscope.Profiler(model, record_ops=False):
        pass


def attrs_of_submodules(model: nn.Module) -> dict[str, list[str]]:
    # The root is left out: the trainers themselves set attributes on it.
    return {path: sorted(vars(m)) for path, m in model.named_modules() if path}


def json_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.json"))


def test_importing_layerscope_imports_no_trainer_framework() -> None:
    code = (
        "import sys, layerscope, layerscope.integrations\n"
        "assert 'lightning' not in sys.modules, 'lightning'\n"
        "assert 'transformers' not in sys.modules, 'transformers'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- Lightning ----------------------------------------------------------------------------


@pytest.fixture
def pl() -> Any:
    return pytest.importorskip("lightning.pytorch")


def tiny_module(pl: Any, fail_at: int | None = None) -> Any:
    """Linear(8, 16) -> ReLU -> Linear(16, 4), MSE loss, SGD; ``fail_at``: the batch
    whose ``training_step`` raises (after the forward, so that step has work)."""

    class TinyModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.mse_loss(self.net(x), y)
            if batch_idx == fail_at:
                raise RuntimeError(f"boom at batch {batch_idx}")
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    return TinyModule()


def lightning_callback(**options: Any) -> Any:
    from layerscope.integrations.lightning import LayerscopeCallback

    return LayerscopeCallback(**options)


def loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=generator), torch.randn(64, 4, generator=generator))
    return torch.utils.data.DataLoader(data, batch_size=4)


def trainer(pl: Any, tmp_path: Path, callback: Any, *, max_steps: int = 8, logger: Any = False) -> Any:
    return pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
        default_root_dir=tmp_path,
        callbacks=[callback],
    )


def test_lightning_profiles_the_scheduled_steps(pl: Any, tmp_path: Path) -> None:
    model = tiny_module(pl)
    attrs = attrs_of_submodules(model)
    keys = list(model.state_dict())
    # 16 batches per epoch, 8 steps: one epoch. Steps 0 idle, 1 warm-up, 2..4 recorded.
    callback = lightning_callback(
        schedule=layerscope.schedule(wait=1, warmup=1, active=3, repeat=1), dirpath=tmp_path / "prof"
    )
    trainer(pl, tmp_path, callback).fit(model, loader())

    files = json_files(tmp_path)
    assert files == [tmp_path / "prof" / "layerscope_steps2-4_rank0.json"]
    assert callback.paths == [str(files[0])]
    prof = check_tree(layerscope.load(files[0]))
    assert prof.figures.steps == 3
    assert prof.meta.step_range == [2, 4]
    assert prof.meta.complete is True
    assert len(prof.figures.step_times_ns) == 3
    # Each recorded step ran the net once.
    assert prof["net"].calls == 3
    for path in ("net.0", "net.2"):
        assert prof[path].backward is not None
        assert prof[path].backward.macs > 0
    # Net.0's weight gradient alone: 3 steps * 4 * 8 * 16 MACs (its input needs no gradient).
    assert prof["net.0"].backward.macs == 3 * 4 * 8 * 16
    part_paths = [p.path for p in prof.parts]
    assert any(path.startswith("<optimizer:") for path in part_paths), part_paths
    assert "<optimizer:SGD>" in part_paths

    assert_no_hooks_left(model)
    assert attrs_of_submodules(model) == attrs
    assert list(model.state_dict()) == keys


# The second "rank" reuses the first one's logger folder on purpose; CSVLogger warns.
@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
def test_lightning_default_folder_and_ranks_share_it(pl: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.loggers import CSVLogger

    def fit_as(rank: int) -> Any:
        # The same folder for both runs (a fixed logger version), as ranks of one job get.
        logger = CSVLogger(tmp_path, name="logs", version="run")
        callback = lightning_callback(schedule=layerscope.schedule(wait=1, active=2, repeat=1))
        with monkeypatch.context() as patch:
            patch.setattr(pl.Trainer, "global_rank", property(lambda self: rank))
            trainer(pl, tmp_path, callback, max_steps=4, logger=logger).fit(tiny_module(pl), loader())
        return callback

    first, second = fit_as(0), fit_as(1)
    folder = tmp_path / "logs" / "run" / "layerscope"
    assert first.paths == [str(folder / "layerscope_steps1-2_rank0.json")]
    assert second.paths == [str(folder / "layerscope_steps1-2_rank1.json")]
    assert sorted(p.name for p in folder.iterdir()) == [
        "layerscope_steps1-2_rank0.json",
        "layerscope_steps1-2_rank1.json",
    ]
    for path, rank in ((first.paths[0], 0), (second.paths[0], 1)):
        prof = check_tree(layerscope.load(path))
        assert prof.meta.rank == rank
        # Steps 1 and 2, each timed and detailed.
        assert prof.figures.step_numbers == [1, 2]
        assert prof.figures.steps == 2


def test_lightning_run_that_raises_is_closed_and_written_incomplete(pl: Any, tmp_path: Path) -> None:
    model = tiny_module(pl, fail_at=4)
    callback = lightning_callback(
        schedule=layerscope.schedule(wait=1, warmup=1, active=3, repeat=1), dirpath=tmp_path
    )
    with pytest.raises(RuntimeError, match="boom at batch 4"):
        trainer(pl, tmp_path, callback).fit(model, loader())

    assert_no_hooks_left(model)
    files = json_files(tmp_path)
    assert [f.name for f in files] == ["layerscope_steps2-4_rank0_incomplete.json"]
    assert callback.paths == [str(files[0])]
    assert json.loads(files[0].read_text())["meta"]["complete"] is False
    prof = check_tree(layerscope.load(files[0]))
    assert prof.meta.complete is False
    assert prof.meta.step_range == [2, 4]
    # Step 4 ran the net's forward before raising: it is kept with steps 2 and 3.
    assert prof["net"].calls == 3


def test_lightning_run_ending_mid_cycle_writes_the_partial_cycle(pl: Any, tmp_path: Path) -> None:
    model = tiny_module(pl)
    # Steps 2..5 would be recorded, but fit stops after step 3.
    callback = lightning_callback(schedule=layerscope.schedule(wait=1, warmup=1, active=4), dirpath=tmp_path)
    trainer(pl, tmp_path, callback, max_steps=4).fit(model, loader())

    assert_no_hooks_left(model)
    assert [Path(p).name for p in callback.paths] == ["layerscope_steps2-3_rank0_incomplete.json"]
    prof = check_tree(layerscope.load(callback.paths[0]))
    assert prof.figures.steps == 2


# -- Hugging Face Trainer -----------------------------------------------------------------


@pytest.fixture
def hf() -> Any:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    from layerscope.integrations import transformers as integration

    return integration


class Sentences(torch.utils.data.Dataset):
    """32 random sentences of 12 tokens from a 100-token vocabulary, labels 0/1."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(i)
        return {
            "input_ids": torch.randint(0, 100, (12,), generator=generator),
            "attention_mask": torch.ones(12, dtype=torch.long),
            "labels": torch.tensor(i % 2),
        }


def tiny_bert(fail_at_call: int | None = None) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    class FailingBert(BertForSequenceClassification):
        def forward(self, input_ids: Any = None, attention_mask: Any = None, labels: Any = None, **kwargs: Any) -> Any:
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
            self.forward_calls += 1
            if self.forward_calls == fail_at_call:
                raise RuntimeError(f"boom at forward {self.forward_calls}")
            return out

    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    if fail_at_call is None:
        return BertForSequenceClassification(config)
    model = FailingBert(config)
    model.forward_calls = 0
    return model


def hf_trainer(tmp_path: Path, model: nn.Module, callback: Any) -> Any:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=4,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    return Trainer(model=model, args=args, train_dataset=Sentences(), callbacks=[callback])


def test_hf_trainer_profiles_the_scheduled_optimizer_steps(hf: Any, tmp_path: Path) -> None:
    model = tiny_bert()
    attrs = attrs_of_submodules(model)
    keys = list(model.state_dict())
    callback = hf.LayerscopeTrainerCallback(schedule=layerscope.schedule(wait=1, warmup=1, active=2, repeat=1))
    hf_trainer(tmp_path, model, callback).train()

    files = json_files(tmp_path)
    assert files == [tmp_path / "layerscope" / "layerscope_steps2-3_rank0.json"]
    assert callback.paths == [str(files[0])]
    prof = check_tree(layerscope.load(files[0]))
    assert prof.figures.steps == 2
    assert prof.meta.step_range == [2, 3]
    assert prof.meta.complete is True
    assert prof.has_backward
    assert prof["classifier"].backward.macs > 0
    assert prof["bert.encoder.layer.0.attention.self.query"].backward.macs > 0
    assert "<optimizer:AdamW>" in [p.path for p in prof.parts]
    # The loss is computed inside BertForSequenceClassification.forward: it is the model's
    # (the root's own ops), forward and backward, not a part of the step outside it.
    root_ops = {(op.name, op.phase) for op in prof[""].ops}
    assert ("aten::nll_loss_forward", "forward") in root_ops
    assert ("aten::nll_loss_backward", "backward") in root_ops
    outside = {op.name for part in prof.parts for node in part.walk() for op in node.ops}
    assert not any("nll_loss" in name for name in outside)

    assert_no_hooks_left(model)
    assert attrs_of_submodules(model) == attrs
    assert list(model.state_dict()) == keys


def test_hf_trainer_with_light_steps_details_the_cycles_first_step(hf: Any, tmp_path: Path) -> None:
    model = tiny_bert()
    callback = hf.LayerscopeTrainerCallback(
        schedule=layerscope.schedule(wait=1, warmup=1, active=3, repeat=1), detail="first",
    )
    hf_trainer(tmp_path, model, callback).train()
    (path,) = json_files(tmp_path)
    prof = check_tree(layerscope.load(path))
    assert (prof.figures.detailed_steps, prof.figures.step_numbers, prof.meta.step_range) == ([2], [3, 4], [2, 4])
    # The gradients' MACs are one step's, the detailed one's: Linear(32, 32) over a batch
    # of 4 sentences of 12 tokens, its input's gradient and its weight's, 48 x 32 x 32 each.
    query = prof["bert.encoder.layer.0.attention.self.query"]
    assert query.backward.macs == 2 * 48 * 32 * 32 and query.calls == 1
    assert_no_hooks_left(model)
    with pytest.raises(ValueError, match="detail must be one of"):
        hf.LayerscopeTrainerCallback(detail="all")


@pytest.mark.slow  # the Trainer compiles the model
def test_hf_trainer_with_torch_compile_profiles_the_model_it_compiled(hf: Any, tmp_path: Path) -> None:
    # torch_compile=True: the Trainer runs torch.compile(model) and hands callbacks the
    # eager model. Before, the block hooked that one: Dynamo traced the hooks (graph
    # breaks at every module) and the profile was of eager modules under broken graphs,
    # with no word of it. Now the block is the compiled wrapper's, from its kernels.
    from transformers import Trainer, TrainingArguments

    model = tiny_bert()
    attrs = attrs_of_submodules(model)
    callback = hf.LayerscopeTrainerCallback(schedule=layerscope.schedule(wait=1, warmup=1, active=2, repeat=1))
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=4, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_pin_memory=False, torch_compile=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Sentences(), callbacks=[callback])
    trainer.train()
    (path,) = callback.paths
    prof = check_tree(layerscope.load(path))
    assert prof.compiled is not None and prof.compiled.kernels
    assert prof.figures.steps == 2 and prof.meta.step_range == [2, 3]
    assert {k.phase for k in prof.compiled.kernels} == {"forward", "backward"}
    assert prof["classifier"].forward.flops > 0 and prof["classifier"].backward.flops > 0
    assert "<optimizer:AdamW>" in [p.path for p in prof.parts]
    # The wrapper's forward is torch.compile's again (the block's own has no such mark).
    assert hasattr(trainer.model_wrapped.__dict__["forward"], "_torchdynamo_orig_callable")
    assert_no_hooks_left(model)
    assert attrs_of_submodules(model) == attrs


def test_hf_trainer_run_that_raises_is_closed_by_the_with_block(hf: Any, tmp_path: Path) -> None:
    # One forward per optimizer step: step 3's forward (the 4th) raises, mid-cycle.
    model = tiny_bert(fail_at_call=4)
    with pytest.raises(RuntimeError, match="boom at forward 4"):
        with hf.LayerscopeTrainerCallback(schedule=layerscope.schedule(wait=1, warmup=1, active=3, repeat=1)) as callback:
            hf_trainer(tmp_path, model, callback).train()

    assert_no_hooks_left(model)
    files = json_files(tmp_path)
    assert [f.name for f in files] == ["layerscope_steps2-3_rank0_incomplete.json"]
    prof = check_tree(layerscope.load(files[0]))
    assert prof.meta.complete is False
    assert prof.figures.steps == 2
