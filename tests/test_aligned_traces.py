"""Traces without module events, read with their model: the real GPU traces with their
Python events removed must give the module tree their with-stack read gives.

The oracle is the same trace read with its ``nn.Module`` events (the Python tracer's,
recorded with ``with_stack=True``): per module and phase (forward, backward, the
recompute of activation checkpointing), device time within 1% for every module of at
least 1% of the step's device time, and FLOPs equal for every module with parameters
and for the whole model. Modules without parameters are left out of the FLOP check: a
with-stack read matches a trace's instances to a model's modules by class and call order,
which cannot tell apart two parameterless siblings of one class when only one is called
(GPT-2's ``attn_dropout`` and ``resid_dropout``: the aligned read puts the dropout in the
one the model's code calls).
"""

from __future__ import annotations

import gzip
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import layerscope
from layerscope.base.errors import LayerscopeWarning
from layerscope.model.check import tree_problems

sys.path.insert(0, str(Path(__file__).parent))
from trace_models import TRACE_MODELS

#: The traces whose aligned read takes seconds here: in the slow tier.
SLOW = {
    "h100_owlv2_inference", "h100_bert_base_fwd", "h100_qwen1.5_0.5b_inference", "mi300x_resnet_ddp_actckpt_train_rank0",
    "h100_gpt2_adamw_train", "h100_llama_bf16_train", "mi300x_bert_small_inference", "mi300x_norm_layers_fwd_bwd",
    "h100_ddp_nccl_train",
}
WITH_MODULES = [name for name in TRACE_MODELS if name != "a100_alexnet_no_modules"]


def _without_python_events(source: Path, target: Path) -> Path:
    """``source`` as torch.profiler would have written it without ``with_stack``: no
    ``python_function`` events (the module calls among them)."""
    with gzip.open(source, "rt") as handle:
        doc = json.load(handle)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "python_function"]
    target.write_text(json.dumps(doc))
    return target


def _device(phase: Any) -> int:
    return (phase.device_time_ns or 0) if phase is not None else 0


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in WITH_MODULES]
)
def test_a_trace_without_module_events_reads_as_its_with_stack_read(
    name: str, shared_traces: Path, tmp_path: Path
) -> None:
    model, inputs = TRACE_MODELS[name]()
    with warnings.catch_warnings():
        # A wrapper the model given does not hold (DDP), a loss module called outside it.
        warnings.simplefilter("ignore", LayerscopeWarning)
        truth = layerscope.load(shared_traces / f"{name}.json.gz", model=model)
    bare = _without_python_events(shared_traces / f"{name}.json.gz", tmp_path / f"{name}.json")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", LayerscopeWarning)
        aligned = layerscope.load(bare, model=model, inputs=inputs)
    # Every pass aligns: nothing to warn of but the template's guesses, where it made some
    # (GPT-2's and Qwen's mask code reads a tensor's value).
    messages = [str(w.message) for w in said if issubclass(w.category, LayerscopeWarning)]
    placed_guesses = aligned.meta.modules_from.placement.guesses
    assert messages == ([] if not placed_guesses else [messages[0]]), messages
    assert all("data-dependent read" in m for m in messages)
    assert tree_problems(aligned) == []
    placed = aligned.meta.modules_from.placement
    assert placed is not None and placed.unaligned == ()
    assert placed.ops == placed.aligned + placed.by_neighbours + placed.unplaced
    # Version drift (the traces were recorded with transformers 5.17) is absorbed by the
    # neighbours; most ops find their own counterpart.
    assert placed.aligned >= 0.5 * placed.ops

    root = truth.root
    step = _device(root.forward) + _device(root.backward) + _device(root.recompute)
    assert step > 0
    compared = 0
    for node in truth.modules():
        mine = aligned[node.path]
        for phase in ("forward", "backward", "recompute"):
            want, got = _device(getattr(node, phase)), _device(getattr(mine, phase))
            if want >= 0.01 * step:
                compared += 1
                assert abs(got - want) <= 0.01 * want, (node.path, phase, want, got)
            if node.params or node.path == "":
                want_flops = getattr(node, phase).flops if getattr(node, phase) is not None else None
                got_flops = getattr(mine, phase).flops if getattr(mine, phase) is not None else None
                assert got_flops == want_flops, (node.path, phase)
    assert compared >= 3


def test_checkpointed_recomputes_are_placed_in_the_calls_they_recompute(shared_traces: Path, tmp_path: Path) -> None:
    """GPT-2 (6 layers) with non-reentrant activation checkpointing: each block's
    forward runs again inside the first backward node that needs its activations. By
    autograd's sequence numbers alone, all of it would be that node's (the block's last
    dropout) backward; aligned on its own, each recompute is its block's."""
    name = "h100_gpt2_ckpt_train"
    model, inputs = TRACE_MODELS[name]()
    bare = _without_python_events(shared_traces / f"{name}.json.gz", tmp_path / "ckpt.json")
    aligned = layerscope.load(bare, model=model, inputs=inputs)
    placed = aligned.meta.modules_from.placement
    assert placed is not None and placed.recomputed > 0
    for k in range(6):
        block = aligned[f"transformer.h.{k}"]
        assert block.recompute is not None and _device(block.recompute) > 0
        # The dropout's own backward is a mask multiply: microseconds, not the block's
        # recompute (about 0.5 ms each on the H100).
        assert _device(aligned[f"transformer.h.{k}.mlp.dropout"].backward) < 20_000


def test_alexnet_without_module_events_gets_a_tree_whose_modules_run_ops_of_their_kind(
    shared_traces: Path,
) -> None:
    """The A100 AlexNet trace never had module events (nor shapes): read with the zoo
    AlexNet, its two forward passes (warm-up and measured) align op for op, and each
    module runs the op of its kind, with device time."""
    model, inputs = TRACE_MODELS["a100_alexnet_no_modules"]()
    profile = layerscope.load(shared_traces / "a100_alexnet_no_modules.json.gz", model=model, inputs=inputs)
    placed = profile.meta.modules_from.placement
    assert placed is not None
    assert (placed.template_ops, placed.passes, placed.aligned, placed.by_neighbours) == (22, 2, 44, 0)
    assert placed.unaligned == ()
    assert tree_problems(profile) == []
    kinds = {"features.0": "aten::conv2d", "features.1": "aten::relu_", "features.2": "aten::max_pool2d",
             "avgpool": "aten::adaptive_avg_pool2d", "classifier.0": "aten::dropout", "classifier.6": "aten::linear"}
    for path, op in kinds.items():
        node = profile[path]
        assert node.calls == 2, path
        assert [row.name for row in profile.ops(module=path)] == [op], path
        assert _device(node.forward) > 0, path


def test_the_placement_is_said_in_the_footer_and_kept_by_a_saved_profile(shared_traces: Path, tmp_path: Path) -> None:
    model, inputs = TRACE_MODELS["h100_bert_base_fwd"]()
    bare = _without_python_events(shared_traces / "h100_bert_base_fwd.json.gz", tmp_path / "bert.json")
    profile = layerscope.load(bare, model=model, inputs=inputs)
    line = next(line for line in profile.render("text").splitlines() if line.startswith("Modules:"))
    placed = profile.meta.modules_from.placement
    assert line == (
        "Modules: aligned to the model's call template (the trace has no nn.Module events): "
        f"{placed.ops} forward ops in 1 pass of a {placed.template_ops}-op template: {placed.aligned} aligned, "
        f"{placed.by_neighbours} placed by neighbours, {placed.unplaced} in no module"
    )
    saved = tmp_path / "bert_profile.json"
    profile.save(saved)
    again = layerscope.load(saved)
    assert again.meta.modules_from.placement == placed
    assert again.root.forward.device_time_ns == profile.root.forward.device_time_ns


def _loss(out: Any) -> Any:
    """A scalar from a model's output: its tensor, its first, or its last hidden state."""
    for attribute in ("logits", "last_hidden_state"):
        out = getattr(out, attribute, out)
    return (out[0] if isinstance(out, tuple) else out).float().sum()


def _record_without_stack(model: Any, inputs: Any, path: Path) -> None:
    """A forward and backward recorded as most runs are: torch.profiler's defaults plus
    shapes, no ``with_stack``."""
    import torch
    from torch.profiler import profile

    args, kwargs = ((), inputs) if isinstance(inputs, dict) else ((inputs,), {})
    _loss(model(*args, **kwargs)).backward()  # warm
    model.zero_grad(set_to_none=True)
    with profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        _loss(model(*args, **kwargs)).backward()
    model.zero_grad(set_to_none=True)
    prof.export_chrome_trace(str(path))


def _tiny_bert() -> tuple[Any, Any]:
    import torch

    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=500
    )
    torch.manual_seed(0)
    return transformers.BertModel(config).eval(), {"input_ids": torch.randint(0, 500, (2, 16))}


@pytest.mark.parametrize("name", ["mlp", "lenet5", pytest.param("gpt", marks=pytest.mark.slow), pytest.param("bert", marks=pytest.mark.slow)])
def test_a_cpu_trace_recorded_here_without_stack_counts_each_modules_flops_as_count_flops(
    name: str, tmp_path: Path
) -> None:
    """Recorded here without ``with_stack`` (so without module events), read with the
    model and its inputs: every module's calls and forward and backward FLOPs are those
    ``count_flops`` counts for the same model and inputs."""
    import torch

    from layerscope import zoo

    if name == "bert":
        model, inputs = _tiny_bert()
    else:
        entry = zoo.get(name)
        torch.manual_seed(0)
        model, inputs = entry.build(), entry.example_inputs(2)
    path = tmp_path / f"{name}.json"
    _record_without_stack(model, inputs, path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    traced = layerscope.load(path, model=model, inputs=inputs)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # only read
    placed = traced.meta.modules_from.placement
    assert placed is not None and placed.unaligned == () and placed.by_neighbours == 0
    assert tree_problems(traced) == []

    counted = layerscope.count_flops(model, inputs, backward=True, loss_fn=_loss)
    for node in counted.modules():
        mine = traced[node.path]
        assert mine.forward.flops == node.forward.flops, node.path
        if node.calls:
            assert mine.calls == node.calls, node.path
        if node.backward is not None and node.backward.flops:
            assert mine.backward is not None and mine.backward.flops == node.backward.flops, node.path


# -- the wrong model, or no inputs: refused or named, never a wrong tree ------------------


def _bert_base_bare(shared_traces: Path, tmp_path: Path) -> Path:
    return _without_python_events(shared_traces / "h100_bert_base_fwd.json.gz", tmp_path / "bert.json")


def _bert(**config: Any) -> Any:
    import torch

    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        return transformers.BertModel(transformers.BertConfig(**config)).eval()


@pytest.mark.slow
def test_a_model_of_another_width_is_refused_with_the_evidence(shared_traces: Path, tmp_path: Path) -> None:
    import torch

    from layerscope.base.errors import TraceModelError

    ids = torch.zeros(8, 128, dtype=torch.long)
    with pytest.raises(TraceModelError) as refused:
        layerscope.load(_bert_base_bare(shared_traces, tmp_path), model=_bert(hidden_size=512, num_attention_heads=8), inputs=ids)
    assert str(refused.value).startswith(
        "'bert.json' was not recorded with this BertModel: embeddings.word_embeddings (Embedding) has weight "
        "[30522, 512], but the trace's ops aligned to embeddings.word_embeddings ran aten::embedding on [30522, 768]"
    )


@pytest.mark.slow
@pytest.mark.parametrize("layers", [6, 14])
def test_a_model_of_another_depth_is_named_and_places_nothing(layers: int, shared_traces: Path, tmp_path: Path) -> None:
    """BERT-base ran 12 layers. A 6-layer model reads the forward as two calls of itself
    (the first of which would align, wrongly); a 14-layer one has two layers no op ran
    in. Either way the step's ops keep no module, and a warning names the pass."""
    import torch

    ids = torch.zeros(8, 128, dtype=torch.long)
    with pytest.warns(LayerscopeWarning, match="did not align with its call template"):
        profile = layerscope.load(_bert_base_bare(shared_traces, tmp_path), model=_bert(num_hidden_layers=layers), inputs=ids)
    placed = profile.meta.modules_from.placement
    assert placed.unaligned and placed.aligned == placed.by_neighbours == 0 and placed.unplaced == placed.ops == 278
    assert all(node.calls == 0 for node in profile.modules())


def test_a_model_without_inputs_to_learn_its_calls_is_said_to_place_nothing(tmp_path: Path) -> None:
    import torch
    from torch.profiler import profile

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with profile(record_shapes=True) as prof:
        model(torch.randn(2, 4))
    prof.export_chrome_trace(str(tmp_path / "run.json"))
    with pytest.warns(LayerscopeWarning, match="no inputs were given to learn the Sequential's calls from"):
        loaded = layerscope.load(tmp_path / "run.json", model=model)
    # Its modules' figures are unknown (shown blank), never 0 calls and 0 ns; the ops are
    # the step's, outside the model.
    assert [node.profiled for node in loaded.modules()] == [False, False, False]
    assert "FLOPs: ? (no module call in the tree)" in loaded.render("text")
