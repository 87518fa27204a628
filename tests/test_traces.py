"""torch.profiler trace files read as profiles: the real GPU traces of ../shared/traces/
(recorded by others on H100, MI300X, B200, A100) and traces recorded here.

Expected figures are computed by hand from the JSON in each test: a module's device time
is the union of the device events launched inside its event, on its thread.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import layerscope
from conftest import ALL_TRACES, REAL_TRACES, tiered
from layerscope.base import fmt as text_fmt
from layerscope.base.comm import is_communication
from layerscope.base.intervals import union_ns
from layerscope.base.kineto_json import us_to_ns
from layerscope.model.check import tree_problems
from layerscope.traces.load import load_trace
from processes import run_layerscope

_LOADED: dict[str, Any] = {}


def _trace(folder: Path, name: str) -> Any:
    if name not in _LOADED:
        _LOADED[name] = load_trace(folder / f"{name}.json.gz")
    return _LOADED[name]


def _events(folder: Path, name: str) -> list[dict[str, Any]]:
    with gzip.open(folder / f"{name}.json.gz", "rt") as handle:
        return json.load(handle)["traceEvents"]


def _span(event: dict[str, Any]) -> tuple[int, int]:
    start = us_to_ns(event["ts"])
    return start, start + us_to_ns(event.get("dur", 0))


def _device_by_launch(events: list[dict[str, Any]]) -> list[tuple[int, int, int, int]]:
    """``(launch thread, launch time, device start, device end)`` of every device event
    whose launch is in the trace, joined by correlation."""
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {})
    }
    found = []
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            launch = launches.get(e["args"].get("correlation"))
            if launch is not None:
                start, end = _span(e)
                found.append((launch["tid"], us_to_ns(launch["ts"]), start, end))
    return found


def _node_named(profile: Any, instance: str) -> Any:
    return next(n for n in profile.modules() if n.path.rsplit(".", 1)[-1] == instance)


@pytest.mark.parametrize("name", tiered(REAL_TRACES))
def test_every_real_trace_loads_and_its_tree_holds(shared_traces: Path, name: str) -> None:
    profile = _trace(shared_traces, name)
    assert tree_problems(profile) == []
    assert profile.meta.mode == "trace"
    assert profile.meta.times_from == "trace" and profile.meta.ops_from is None  # one fact, one name
    assert profile.meta.source.file == f"{name}.json.gz"
    device = profile.meta.device_events
    assert device.events > 0
    # Without the model, parameters are unknown, never 0.
    assert profile.root.params is None and profile.param_bytes is None
    text = profile.render("text")
    assert f"From the torch.profiler trace {name}.json.gz" in text
    assert "Params: ?" in text


@pytest.mark.parametrize(
    ("name", "instances"),
    [
        ("h100_bert_small_inference", ["BertEmbeddings_0", "BertLayer_1", "BertSdpaSelfAttention_2", "Linear_25"]),
        ("mi300x_bert_small_inference", ["BertEmbeddings_0", "BertLayer_1", "BertSdpaSelfAttention_2", "Linear_25"]),
        ("h100_qwen1.5_0.5b_inference", ["Qwen2DecoderLayer_3", "Qwen2MLP_7", "Qwen2RMSNorm_0"]),
        pytest.param("h100_owlv2_inference", ["Owlv2VisionTransformer_0", "Owlv2EncoderLayer_3"], marks=pytest.mark.slow),
    ],
)
def test_device_time_of_a_module_is_the_union_of_what_it_launched(shared_traces: Path, name: str, instances: list[str]) -> None:
    """A node's device time: the union of the device events launched inside the calls of
    its module and of every module under it in the tree (a module shared by two parents,
    OWLv2's post-layernorm, is one node with all its calls); its self device time: those
    launched inside its own calls and outside its child modules' calls."""
    events = _events(shared_traces, name)
    device = _device_by_launch(events)
    calls: dict[str, list[tuple[int, int, int]]] = {}
    for e in events:
        if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: "):
            calls.setdefault(e["name"][len("nn.Module: ") :], []).append((e["tid"], *_span(e)))
    profile = _trace(shared_traces, name)

    def launched_in(spans: list[tuple[int, int, int]]) -> set[int]:
        return {i for i, (tid, at, _, _) in enumerate(device) if any(t == tid and s <= at <= e for t, s, e in spans)}

    for instance in instances:
        node = _node_named(profile, instance)
        subtree = [n.path.rsplit(".", 1)[-1] for n in node.walk() if n.kind == "module"]
        everything = launched_in([span for inst in subtree for span in calls[inst]])
        children = [c.path.rsplit(".", 1)[-1] for c in node.children if c.kind == "module"]
        own = launched_in(calls[instance]) - launched_in([span for inst in children for span in calls[inst]])
        assert everything, instance
        assert node.forward.device_time_ns == union_ns([device[i][2:] for i in everything]), instance
        assert node.forward.self_device_time_ns == union_ns([device[i][2:] for i in own]), instance
        assert node.calls == len(calls[instance])


def _backward_by_module(events: list[dict[str, Any]]) -> tuple[dict[str, list[tuple[int, int]]], list[tuple[int, int]]]:
    """By hand: each backward node's device events, given to the module whose forward
    op made the node (the innermost module event around the earliest forward op with the
    node's sequence number); a gradient accumulation (no number) to the module of the
    node run before it, as autograd's engine runs it right after that node; and all
    backward device events."""
    device = _device_by_launch(events)
    modules = [e for e in events if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    forward_ops: dict[int, dict[str, Any]] = {}
    nodes = []
    for e in sorted((e for e in events if "ts" in e), key=lambda e: _span(e)[0]):
        if e.get("cat") != "cpu_op":
            continue
        if e["name"].startswith("autograd::engine::evaluate_function: "):
            nodes.append(e)
        elif "Sequence number" in e.get("args", {}):
            forward_ops.setdefault(e["args"]["Sequence number"], e)
    by_module: dict[str, list[tuple[int, int]]] = {}
    every: list[tuple[int, int]] = []
    last: str | None = None
    for node in nodes:
        start, end = _span(node)
        launched = [(d0, d1) for tid, at, d0, d1 in device if tid == node["tid"] and start <= at <= end]
        every.extend(launched)
        owner = None
        if node["name"].endswith("AccumulateGrad") or "Sequence number" not in node["args"]:
            owner = last
        else:
            op = forward_ops.get(node["args"]["Sequence number"])
            if op is not None:
                at = _span(op)[0]
                around = [m for m in modules if m["tid"] == op["tid"] and _span(m)[0] <= at <= _span(m)[1]]
                if around:
                    owner = max(around, key=lambda m: _span(m)[0])["name"][len("nn.Module: ") :]
            last = owner
        if owner is not None:
            by_module.setdefault(owner, []).extend(launched)
    return by_module, every


def test_norm_layers_backward_device_time_by_module(shared_traces: Path) -> None:
    name = "mi300x_norm_layers_fwd_bwd"
    by_module, every = _backward_by_module(_events(shared_traces, name))
    profile = _trace(shared_traces, name)
    checked = 0
    for instance, spans in by_module.items():
        node = _node_named(profile, instance)
        if any(c.kind == "module" for c in node.children):
            continue
        assert node.backward is not None, instance
        assert node.backward.self_device_time_ns == union_ns(spans), instance
        checked += 1
    assert checked >= 5
    # How much of the backward was attributed to modules (the rest: the loss, accumulation).
    in_modules = profile.root.backward.device_time_ns
    assert 0 < in_modules <= union_ns(every)


def test_activation_checkpointing_recompute_on_the_ddp_trace(shared_traces: Path) -> None:
    profile = _trace(shared_traces, "mi300x_resnet_ddp_actckpt_train_rank0")
    assert profile.meta.rank == 0 and profile.meta.world_size == 8
    wrappers = [n for n in profile.modules() if n.type == "CheckpointWrapper"]
    assert len(wrappers) == 4
    for wrapper in wrappers:
        inner = wrapper.children[0]
        # The checkpointed block ran again in backward: recompute, never counted as forward.
        assert inner.recompute is not None and inner.recompute.cpu_time_ns > 0
        assert inner.recompute.flops == inner.forward.flops > 0
        assert inner.backward is not None and inner.backward.device_time_ns > 0
    assert profile.root.recompute.flops == sum(w.forward.flops for w in wrappers)
    # Kernels launched before the trace began are in no node, and said.
    assert profile.meta.device_events.orphans == 968
    assert "968 launched before the trace began" in profile.render("text")


def _collective_kernels(events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    words = ("nccl", "rccl", "all_reduce", "allreduce", "allgather", "all_gather", "reduce_scatter")
    return [
        _span(e) for e in events
        if e.get("cat") == "kernel" and any(w in e["name"].lower() for w in words)
    ]


@pytest.mark.parametrize("name", ["mi300x_resnet_ddp_actckpt_train_rank0", "b200_gptoss_tp8_rank0"])
def test_collectives_per_module_on_ranked_traces(shared_traces: Path, name: str) -> None:
    events = _events(shared_traces, name)
    profile = _trace(shared_traces, name)
    assert profile.meta.rank == 0 and profile.meta.world_size == 8
    comm_ops = [
        (node.path, op) for top in (profile.root, *profile.parts) for node in top.walk() for op in node.ops
        if is_communication(op.name)
    ]
    assert comm_ops
    by_hand = _collective_kernels(events)
    # Every collective kernel is the steps' communication, never an op's compute time.
    assert profile.device.comm_ns == union_ns(by_hand)
    assert 0 < profile.device.overlap_ns <= profile.device.comm_ns or name.startswith("b200")


@pytest.mark.parametrize("name", tiered(REAL_TRACES))
def test_every_device_nanosecond_of_a_real_trace_is_in_one_place(shared_traces: Path, name: str) -> None:
    """Busy = the nodes' self device time + what no node holds, by a named reason; the
    footer says so, and its device total is the table's root row."""
    profile = _trace(shared_traces, name)
    ledger = profile.device
    assert ledger is not None
    nodes = sum(s.self_device_time_ns or 0 for n in profile.nodes() for _, s in n.phases())
    assert ledger.attributed_ns == nodes
    assert ledger.busy_ns == ledger.attributed_ns + ledger.unattributed_ns
    assert set(ledger.unattributed_ns_by_reason) <= {"communication", "no_op_range", "no_node"}
    assert all(ns > 0 for ns in ledger.unattributed_ns_by_reason.values())
    # The steps' busy time is no more than all the trace's device work, counted once.
    assert ledger.busy_ns <= profile.meta.device_events.time_ns
    text = profile.render("text")
    assert f"Device busy {text_fmt.time_ns(ledger.busy_ns)} = attributed {text_fmt.time_ns(ledger.attributed_ns)}" in text
    root_total = sum(s.device_time_ns or 0 for _, s in profile.root.phases())
    assert f"Device total: {text_fmt.time_ns(root_total)}" in text


def test_the_tensor_parallel_all_reduce_without_nccl_in_its_name_is_communication(shared_traces: Path) -> None:
    profile = _trace(shared_traces, "b200_gptoss_tp8_rank0")
    names = {op.name for node in profile.nodes() for op in node.ops if is_communication(op.name)}
    assert "symm_mem::multimem_all_reduce_" in names


@pytest.mark.parametrize(
    ("name", "label", "instance"),
    [
        ("mi300x_norm_layers_fwd_bwd", "BatchNorm affine=True", "BatchNorm2d_0"),
        ("h100_ddp_nccl_train", "DistributedDataParallel.forward", "Sequential_0"),
    ],
)
def test_a_range_that_encloses_a_module_is_its_parent(shared_traces: Path, name: str, label: str, instance: str) -> None:
    events = _events(shared_traces, name)

    def host_ns(event_name: str, category: str) -> int:
        spans = [_span(e) for e in events if e.get("name") == event_name and e.get("cat") == category]
        assert spans
        return sum(end - start for start, end in spans)

    # The range's host time, and the module's inside it (every call of each, summed):
    # norm layers: 127,976.985 + 669.129 + 223.894 us, BatchNorm2d_0's 127,710.817 +
    # 544.032 + 166.438 us; DDP: 4,155.807 us, Sequential_0's 1,145.056 us.
    range_ns = host_ns(label, "user_annotation")
    module_ns = host_ns(f"nn.Module: {instance}", "python_function")
    assert (range_ns, module_ns) == {
        "mi300x_norm_layers_fwd_bwd": (128_870_008, 128_421_287),
        "h100_ddp_nccl_train": (4_155_807, 1_145_056),
    }[name]
    profile = _trace(shared_traces, name)
    assert tree_problems(profile) == []
    module = _node_named(profile, instance)
    outer = profile[module.parent]
    assert (outer.kind, outer.name, outer.children) == ("label", label, [module])
    assert profile[module.path] is module  # the module keeps its path
    assert module.forward.cpu_time_ns == module_ns
    assert outer.forward.cpu_time_ns == range_ns
    assert outer.forward.self_cpu_time_ns == range_ns - module_ns
    assert outer.parent == module.path.rpartition(".")[0]  # the range ran in the module's parent
    # Stacks (folded, speedscope) name the module by its own name under the range.
    assert f";[{label}];{instance} " in profile.render("folded")


def test_a_trace_without_module_events_is_its_labels_and_ops(shared_traces: Path) -> None:
    profile = _trace(shared_traces, "a100_alexnet_no_modules")
    assert profile.meta.modules_from.instances == 0
    labels = [n for n in profile.nodes() if n.kind == "label"]
    assert labels
    assert "no nn.Module events" in profile.render("text")


def test_diff_of_one_model_on_two_vendors_gpus(shared_traces: Path, tmp_path: Path) -> None:
    done = run_layerscope(
        ["diff", str(shared_traces / "h100_bert_small_inference.json.gz"),
         str(shared_traces / "mi300x_bert_small_inference.json.gz"), "--format", "json"], tmp_path,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc
    h100 = _trace(shared_traces, "h100_bert_small_inference")
    mi300x = _trace(shared_traces, "mi300x_bert_small_inference")
    assert [n.path for n in h100.modules()] == [n.path for n in mi300x.modules()]
    assert h100.meta.source.device_names == ("NVIDIA H100 80GB HBM3",)
    assert mi300x.meta.source.device_names == ("AMD Instinct MI300X VF",)


@pytest.mark.slow  # command lines end to end
def test_rank_traces_merge(shared_traces: Path, tmp_path: Path) -> None:
    # A second rank of the same run, made from rank 0's trace (in a temporary folder):
    # only its distributedInfo differs.
    with gzip.open(shared_traces / "mi300x_resnet_ddp_actckpt_train_rank0.json.gz", "rt") as handle:
        doc = json.load(handle)
    doc["distributedInfo"]["rank"] = 1
    with gzip.open(tmp_path / "rank1.json.gz", "wt") as handle:
        json.dump(doc, handle)
    done = run_layerscope(
        ["merge", str(shared_traces / "mi300x_resnet_ddp_actckpt_train_rank0.json.gz"), str(tmp_path / "rank1.json.gz"),
         "-o", str(tmp_path / "m.json")], tmp_path,
    )
    assert done.returncode == 0, done.stderr
    merged = layerscope.load(tmp_path / "m.json")
    assert merged.world_size == 8 and merged.rank_numbers == [0, 1]
    assert merged.missing_ranks == [2, 3, 4, 5, 6, 7]


# -- traces recorded here, with the model --------------------------------------------


def _record(model: torch.nn.Module, inputs: Any, path: Path, loss: Any) -> None:
    from torch.profiler import profile

    args = inputs if isinstance(inputs, tuple) else (inputs,)
    loss(model(*args)).backward()  # warm
    model.zero_grad(set_to_none=True)
    with profile(with_stack=True, record_shapes=True, profile_memory=True) as prof:
        loss(model(*args)).backward()
    model.zero_grad(set_to_none=True)
    prof.export_chrome_trace(str(path))


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    return out[0]


def _same_flops(model: torch.nn.Module, inputs: Any, path: Path) -> None:
    loss = lambda out: _first(out).float().sum()  # noqa: E731
    _record(model, inputs, path, loss)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    traced = layerscope.load(path, model=model)
    # Reading a trace with the model only reads the model.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    counted = layerscope.count_flops(model, inputs, backward=True, loss_fn=loss)
    assert tree_problems(traced) == []
    assert traced.meta.modules_from.unmatched == ()
    assert [n.path for n in traced.modules()] == [n.path for n in counted.modules()]
    for node in counted.modules():
        mine = traced[node.path]
        assert mine.calls == node.calls, node.path
        assert mine.params == node.params, node.path
        assert mine.forward.flops == node.forward.flops, node.path
        assert mine.forward.macs == node.forward.macs, node.path
        if node.backward is not None and node.backward.flops:
            assert mine.backward is not None and mine.backward.flops == node.backward.flops, node.path


@pytest.mark.parametrize("name", tiered(["mlp", "lenet5", "resnet18", "gpt", "vit_b_16"], slow=("resnet18", "vit_b_16")))
def test_zoo_traces_recorded_here_match_count_flops(name: str, tmp_path: Path) -> None:
    from layerscope import zoo

    entry = zoo.get(name)
    torch.manual_seed(0)
    _same_flops(entry.build(), entry.example_inputs(2), tmp_path / f"{name}.json")


def test_bert_trace_recorded_here_matches_count_flops(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=500
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 500, (2, 16))
    _same_flops(model, ids, tmp_path / "bert.json")


# -- the model a trace is read with: checked against the trace's shapes ---------------

#: BERT-small as h100_bert_small_inference recorded it, read from its ops' Input Dims:
#: aten::embedding on [30522, 512], [512, 512] and [2, 512] (vocabulary, positions, token
#: types; hidden 512); aten::linear on [2048, 512] four times (4 layers, intermediate
#: 2048); aten::scaled_dot_product_attention on [1, 8, 141, 64] (8 heads).
_BERT_SMALL = {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 2048}
#: Its parameters, by hand (V 30522, H 512, P 512, T 2, I 2048, 4 layers; the decoder's
#: weight and bias are tied to the word embeddings and the head's bias, counted once):
#: embeddings V*H + P*H + T*H + LayerNorm 2H = 15,627,264 + 262,144 + 1,024 + 1,024 = 15,891,456
#: a layer: q, k, v, o 4*(H*H + H) = 1,050,624; 2 LayerNorms 2*2H = 2,048;
#:          intermediate H*I + I = 1,050,624; output I*H + H = 1,049,088: 3,152,384, x4 = 12,609,536
#: the head: transform H*H + H = 262,656, LayerNorm 2H = 1,024, bias V = 30,522: 294,202
_BERT_SMALL_PARAMS = 15_891_456 + 12_609_536 + 294_202  # 28,795,194


def _bert_lm_head(**config: Any) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        return transformers.BertLMHeadModel(transformers.BertConfig(is_decoder=True, **config))


def test_a_trace_read_with_another_model_is_refused_with_the_evidence(shared_traces: Path) -> None:
    from layerscope.base.errors import TraceModelError

    # BERT-base (hidden 768) for a trace of BERT-small (hidden 512).
    with pytest.raises(TraceModelError) as refused:
        layerscope.load(shared_traces / "h100_bert_small_inference.json.gz", model=_bert_lm_head())
    assert str(refused.value) == (
        "'h100_bert_small_inference.json.gz' was not recorded with this BertLMHeadModel: "
        "bert.embeddings.word_embeddings (Embedding) has weight [30522, 768], but the trace's Embedding_0 ran "
        "aten::embedding on [30522, 512], [1, 141] (and 37 more of the 39 modules checked); load it with the "
        "model that was traced (on the command line: --model SPEC, with --config KEY=VALUE,... for a "
        "transformers: model's size)"
    )


@pytest.mark.parametrize("name", ["h100_bert_small_inference", "mi300x_bert_small_inference"])
def test_the_traced_model_matches_every_instance_and_counts_its_parameters_once(shared_traces: Path, name: str) -> None:
    import warnings

    from layerscope.base.errors import LayerscopeWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", LayerscopeWarning)  # a whole fit: nothing to warn of
        profile = layerscope.load(shared_traces / f"{name}.json.gz", model=_bert_lm_head(**_BERT_SMALL))
    how = profile.meta.modules_from
    assert (how.matched, how.instances, how.unmatched) == (84, 84, ())
    # The trace's BertSdpaSelfAttention is this transformers' BertSelfAttention.
    assert how.renamed == {f"BertSdpaSelfAttention_{k}": "BertSelfAttention" for k in range(4)}
    assert how.shapes == "parameter shapes checked against the ops' recorded inputs: 39 modules, all fit"
    assert profile.root.params_total == _BERT_SMALL_PARAMS
    # The model as given is float32, the traced one ran in bf16: its ops were given bf16
    # parameters (the LM head's bias too, which the head owns and its decoder uses), so 2
    # bytes each: 57,590,388 bytes = 54.92 MiB, not the given model's 109.84 MiB.
    assert profile.param_bytes == _BERT_SMALL_PARAMS * 2 == 57_590_388
    text = profile.render("text", depth=0)
    assert "Params: 28.80M (54.92 MiB)" in text
    assert "Memory: parameters 54.92 MiB\n" in text
    assert tree_problems(profile) == []


def test_a_deeper_model_than_the_trace_ran_is_a_warning_naming_its_layers(shared_traces: Path) -> None:
    from layerscope.base.errors import LayerscopeWarning

    deeper = _bert_lm_head(**{**_BERT_SMALL, "num_hidden_layers": 6})
    with pytest.warns(LayerscopeWarning) as said:
        profile = layerscope.load(shared_traces / "h100_bert_small_inference.json.gz", model=deeper)
    assert [str(w.message) for w in said] == [
        "layerscope: h100_bert_small_inference.json.gz: the BertLMHeadModel fits the trace only in part: 2 of "
        "its modules with parameters ran in no instance (bert.encoder.layer.4, bert.encoder.layer.5); is it the "
        "model that was traced?"
    ]
    assert profile.meta.modules_from.uncalled == ("bert.encoder.layer.4", "bert.encoder.layer.5")
    assert "modules of the model that ran in no instance: bert.encoder.layer.4, bert.encoder.layer.5" in profile.render("text")


def test_a_trace_without_shapes_says_once_that_the_model_is_not_checked(tmp_path: Path) -> None:
    from torch.profiler import profile

    from layerscope import zoo
    from layerscope.base.errors import LayerscopeWarning

    model = zoo.get("lenet5").build()
    with profile(with_stack=True, record_shapes=False) as prof:
        model(zoo.get("lenet5").example_inputs(1))
    prof.export_chrome_trace(str(tmp_path / "run.json"))
    with pytest.warns(LayerscopeWarning) as said:
        traced = layerscope.load(tmp_path / "run.json", model=model)
    assert [str(w.message) for w in said] == [
        "layerscope: run.json: the model's parameter shapes cannot be checked against this trace: it recorded no "
        "input shapes (record_shapes=False); modules are matched by class and call order alone"
    ]
    assert traced.meta.modules_from.unmatched == ()


def test_parameter_memory_of_a_trace_read_with_its_model_is_what_params_counts(tmp_path: Path) -> None:
    from layerscope import zoo

    model = zoo.get("lenet5").build()
    _record(model, zoo.get("lenet5").example_inputs(2), tmp_path / "run.json", lambda out: out.sum())
    traced = layerscope.load(tmp_path / "run.json", model=model)
    # LeNet-5: conv1 6*1*5*5 + 6 = 156, conv2 16*6*5*5 + 16 = 2,416, fc1 120*400 + 120 =
    # 48,120, fc2 84*120 + 84 = 10,164, fc3 10*84 + 10 = 850: 61,706 float32 parameters,
    # 4 bytes each: 246,824 bytes = 241.04 KiB, in the Params line and the memory line alike.
    assert traced.root.params_total == 61_706
    assert traced.param_bytes == 61_706 * 4
    text = traced.render("text")
    assert "Params: 61.71K (241.04 KiB)" in text
    assert "Memory: parameters 241.04 KiB\n" in text


@pytest.mark.slow  # command lines end to end
def test_show_a_trace_with_its_model_sized_by_config(shared_traces: Path, tmp_path: Path) -> None:
    from test_cli import assert_usage_error, run_cli

    trace = str(shared_traces / "h100_bert_small_inference.json.gz")
    sized = ",".join(f"{key}={value}" for key, value in _BERT_SMALL.items())
    # is_decoder=true: what BertLMHeadModel is built for (else transformers logs a line).
    done = run_cli(
        "show", trace, "--model", "transformers:BertLMHeadModel", "--config", f"{sized},is_decoder=true",
        "--format", "json", cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    doc = json.loads(done.stdout)
    assert doc["meta"]["modules_from"]["matched"] == doc["meta"]["modules_from"]["instances"] == 84
    assert doc["totals"]["param_bytes"] == _BERT_SMALL_PARAMS * 2  # bf16, as traced
    # The default config (BERT-base) is not what ran: one line, the evidence, exit 2.
    line = assert_usage_error(run_cli(
        "show", trace, "--model", "transformers:BertLMHeadModel", "--config", "is_decoder=true", cwd=tmp_path,
    ))
    assert "bert.embeddings.word_embeddings (Embedding) has weight [30522, 768]" in line
    assert "aten::embedding on [30522, 512], [1, 141]" in line
    line = assert_usage_error(run_cli("show", trace, "--config", sized, cwd=tmp_path))
    assert line == "layerscope: error: --config sizes the model --model SPEC names (a transformers: one); give --model too"


# -- the command line -------------------------------------------------------------------


def test_show_a_trace_in_every_format(shared_traces: Path, tmp_path: Path) -> None:
    from layerscope.base.formats import formats
    from test_cli import run_cli

    trace = shared_traces / "mi300x_resnet_ddp_actckpt_train_rank0.json.gz"
    done = run_cli("show", str(trace), "--depth", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ResNet_0" in done.stdout and "recompute" in done.stdout
    assert "rank 0 of 8" in done.stdout
    profile = _trace(shared_traces, "mi300x_resnet_ddp_actckpt_train_rank0")
    for fmt in formats("profile"):
        # kernels: a torch.compile'd model's; png: the memory timeline, which this trace
        # (recorded without profile_memory) has not.
        if fmt in ("kernels", "png"):
            continue
        assert profile.render(fmt), fmt
    assert _trace(shared_traces, "mi300x_norm_layers_fwd_bwd").render("png")


def test_show_a_recorded_trace_with_its_model_spec(tmp_path: Path) -> None:
    from layerscope import zoo
    from test_cli import run_cli

    entry = zoo.get("lenet5")
    torch.manual_seed(0)
    model = entry.build()
    _record(model, entry.example_inputs(2), tmp_path / "run.json", lambda out: out.sum())
    done = run_cli("show", "run.json", "--model", "zoo:lenet5", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    paths = [node["path"] for node in doc["modules"]]
    assert paths == [path for path, _ in model.named_modules()]
    assert doc["meta"]["modules_from"]["matched"] == len(paths)
    assert doc["totals"]["param_bytes"] == sum(p.numel() * 4 for p in model.parameters())
    # Without the model: instance names, parameters unknown.
    done = run_cli("show", "run.json", "--format", "json", cwd=tmp_path)
    doc = json.loads(done.stdout)
    assert doc["modules"][1]["path"] == "Sequential_0" and doc["totals"]["param_bytes"] is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "not valid JSON"),
        (gzip.compress(b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm"', mtime=0)[:-8], "truncated"),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1', "truncated"),
        (b'{"schemaVersion": 1, "traceEvents": []}', "nothing to profile"),
    ],
    ids=["empty", "gzip cut short", "json cut short", "no events"],  # the same ids in every xdist worker
)
def test_a_bad_trace_is_one_line_and_exit_2(tmp_path: Path, content: bytes, expected: str) -> None:
    from test_cli import assert_usage_error, run_cli

    (tmp_path / "bad.json.gz").write_bytes(content)
    line = assert_usage_error(run_cli("show", "bad.json.gz", cwd=tmp_path))
    assert "bad.json.gz" in line and expected in line, line


def test_show_a_truncated_gz_trace_says_where_its_gzip_stream_ended(tmp_path: Path) -> None:
    from layerscope import zoo
    from test_cli import assert_usage_error, run_cli

    entry = zoo.get("lenet5")
    _record(entry.build(), entry.example_inputs(1), tmp_path / "run.json", lambda out: out.sum())
    packed = gzip.compress((tmp_path / "run.json").read_bytes())
    cut = len(packed) // 2  # a copy stopped halfway: no end-of-stream marker, no size trailer
    (tmp_path / "cut.json.gz").write_bytes(packed[:cut])
    line = assert_usage_error(run_cli("show", "cut.json.gz", cwd=tmp_path))
    assert line == (
        f"layerscope: error: 'cut.json.gz' is truncated: its gzip stream ended early, after {cut:,} compressed "
        "bytes, with no end-of-stream marker (a partial copy or download?); expected a whole .json.gz file"
    )


def test_model_is_refused_for_a_saved_profile(tmp_path: Path) -> None:
    from layerscope import zoo

    path = tmp_path / "p.json"
    layerscope.count_flops(zoo.get("mlp").build(), zoo.get("mlp").example_inputs(1)).save(path)
    with pytest.raises(ValueError, match="not one"):
        layerscope.load(path, model=zoo.get("mlp").build())


def test_overloads_are_told_from_the_recorded_input_kinds() -> None:
    from layerscope.flops.recorded import overload_for

    assert overload_for("aten::add", ("tensor", "tensor", "scalar")) == "Tensor"
    assert overload_for("aten::add", ("tensor", "scalar", "scalar")) == "Scalar"
    assert overload_for("aten::sum", ("tensor", "?")) == "default"
    assert overload_for("aten::sum", ("tensor", "scalars", "scalar", "?")) == "dim_IntList"
    assert overload_for("aten::to", ("tensor", "scalar", "scalar", "scalar", "?")) == "dtype"
    assert overload_for("aten::cat", ("tensors", "scalar")) == "default"
    assert overload_for("no_such::op", ("tensor",)) == ""


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_a_range_across_a_step_mark_stays_whole_in_the_step_it_began_in(tmp_path: Path) -> None:
    # Lightning steps the profiler in the middle of its optimizer's closure: the
    # optimizer's range (50-150 us) runs past ProfilerStep#1's end (100 us).
    events = [
        _x("user_annotation", "ProfilerStep#1", 0, 100),
        _x("user_annotation", "ProfilerStep#2", 100, 100),
        _x("user_annotation", "Optimizer.step#SGD.step", 50, 100),
        _x("python_function", "nn.Module: Linear_0", 60, 80, **{"Python id": 2, "Python parent id": 1}),
        _x("cpu_op", "aten::relu", 70, 60),
        _x("cpu_op", "aten::relu", 160, 30),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}), encoding="utf-8")
    profile = layerscope.load(path)
    assert tree_problems(profile) == []
    assert profile.figures.step_numbers == [1, 2]
    # Step 1 ends where the optimizer's range does (150 us); step 2 runs on to 200 us.
    assert profile.figures.step_times_ns == [150_000, 50_000]
    # The module's call inside the optimizer's range (a closure) is the model's time; the
    # optimizer's part keeps the rest of its 100 us.
    optimizer = next(p for p in profile.parts if p.kind == "optimizer")
    linear = profile.root  # the one top-level instance is the root
    assert (linear.type, linear.calls, linear.forward.cpu_time_ns) == ("Linear", 1, 80_000)
    assert optimizer.forward.cpu_time_ns == 20_000


# -- MFU: the peak of the GPU the trace names ------------------------------------------


def test_the_peak_of_a_trace_is_its_gpus_datasheet_figure_at_the_dtype_its_matrix_ops_ran_in(tmp_path: Path) -> None:
    def mm(ts: float, dtype: str) -> dict[str, Any]:
        return _x("cpu_op", "aten::mm", ts, 10, **{"Input type": [dtype, dtype], "Input Dims": [[4, 8], [8, 2]]})

    def load(device: str, dtypes: list[str]) -> Any:
        events = [mm(20 * i, dtype) for i, dtype in enumerate(dtypes)]
        path = tmp_path / "t.json"
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": device}], "traceEvents": events}
        path.write_text(json.dumps(doc), encoding="utf-8")
        return layerscope.load(path).meta

    # Three of the four matrix products ran in bfloat16: the A100's dense bf16 figure,
    # 312 TFLOP/s (base/peaks.py), not its float32 one.
    meta = load("NVIDIA A100-SXM4-80GB", ["c10::BFloat16", "float", "c10::BFloat16", "c10::BFloat16"])
    assert meta.peak_flops_per_s == 312 * 10**12
    assert meta.peak_from == (
        "the NVIDIA A100-SXM4-80GB's dense bfloat16 figure in layerscope's datasheet table "
        "(bfloat16 in 3 of 4 matrix-op calls)"
    )
    # A dtype the table has no figure for, a GPU it does not list: unknown, and why.
    meta = load("NVIDIA A100-SXM4-80GB", ["double"])
    assert meta.peak_flops_per_s is None
    assert meta.peak_from == (
        "layerscope's datasheet table has no float64 figure for the NVIDIA A100-SXM4-80GB "
        "(float64 in 1 of 1 matrix-op calls)"
    )
    meta = load("Some Accelerator 9000", ["float"])
    assert (meta.peak_flops_per_s, meta.peak_from) == (None, "the Some Accelerator 9000 is not in layerscope's datasheet table")


def test_the_api_gives_a_real_traces_peak(shared_traces: Path) -> None:
    # BERT-base in fp32 on an H100: its dense fp32 figure, 67 TFLOP/s (base/peaks.py).
    meta = layerscope.load(shared_traces / "h100_bert_base_fwd.json.gz").meta
    assert meta.peak_flops_per_s == 67 * 10**12
    assert "dense float32 figure" in (meta.peak_from or "")
    # The AMD Instinct MI300X (its virtual function here), BERT in bf16: AMD's datasheet
    # figure for dense bf16, 1,307.4 TFLOP/s.
    meta = _trace(shared_traces, "mi300x_bert_small_inference").meta
    assert meta.peak_flops_per_s == int(1307.4 * 10**12)
    assert meta.peak_from == (
        "the AMD Instinct MI300X VF's dense bfloat16 figure in layerscope's datasheet table "
        "(bfloat16 in 56 of 56 matrix-op calls)"
    )
    # The B200 (GPT-OSS, tensor-parallel rank 0), in bf16: NVIDIA's dense 2,250 TFLOP/s.
    meta = _trace(shared_traces, "b200_gptoss_tp8_rank0").meta
    assert meta.peak_flops_per_s == 2250 * 10**12
    assert (meta.peak_from or "").startswith("the NVIDIA B200's dense bfloat16 figure")


def test_mfu_of_a_training_trace_is_its_phases_flops_over_their_busy_time(shared_traces: Path) -> None:
    # Llama in bf16, one AdamW step on an H100: 153 of its 155 matrix-op calls ran in
    # bfloat16 (two in float32: the loss's), so the peak is the dense bf16 989 TFLOP/s.
    profile = _trace(shared_traces, "h100_llama_bf16_train")
    assert profile.meta.peak_flops_per_s == 989 * 10**12
    assert "(bfloat16 in 153 of 155 matrix-op calls)" in (profile.meta.peak_from or "")
    forward, backward = profile.root.forward, profile.root.backward
    assert (forward.flops, forward.busy_time_ns) == (336_654_461_440, 1_808_742)
    assert (backward.flops, backward.busy_time_ns) == (681_541_427_200, 3_203_755)
    # (336_654_461_440 + 681_541_427_200) FLOPs in (1_808_742 + 3_203_755) ns
    # = 1_018_195_888_640 / 5_012_497e-9 s = 203.13 TFLOP/s; / 989 TFLOP/s = 20.5%
    text = profile.render("text", columns=["mfu"], depth=0)
    assert "LlamaForCausalLM  | 20.5%" in text.splitlines()


def test_show_gives_a_traces_mfu_from_the_gpu_it_names(shared_traces: Path, tmp_path: Path) -> None:
    from test_cli import run_cli

    trace = str(shared_traces / "h100_bert_base_fwd.json.gz")
    profile = _trace(shared_traces, "h100_bert_base_fwd")
    assert (profile.root.forward.flops, profile.root.forward.busy_time_ns) == (179_124_842_496, 6_412_809)
    # 179_124_842_496 FLOPs in 6_412_809 ns (its kernels' busy time) = 27.93 TFLOP/s;
    # against the H100's dense fp32 67 TFLOP/s that is 41.69%, against 100 TFLOP/s 27.93%.
    done = run_cli("show", trace, "--columns", "mfu", "--depth", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "BertModel | 41.7%" in lines
    assert (
        "MFU against a peak of 67.00 TFLOP/s: the NVIDIA H100 80GB HBM3's dense float32 figure in "
        "layerscope's datasheet table (float32 in 158 of 158 matrix-op calls)"
    ) in lines
    done = run_cli("show", trace, "--columns", "mfu", "--depth", "0", "--peak-tflops", "100", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "BertModel | 27.9%" in lines
    assert "MFU against a peak of 100.00 TFLOP/s: given (--peak-tflops 100)" in lines


def test_show_says_why_mfu_is_blank_for_a_gpu_not_in_the_table(shared_traces: Path, tmp_path: Path) -> None:
    from test_cli import assert_usage_error, run_cli

    # The MI300X's trace, its GPU renamed to one the table does not list.
    doc = json.loads(gzip.decompress((shared_traces / "mi300x_bert_small_inference.json.gz").read_bytes()))
    for device in doc["deviceProperties"]:
        device["name"] = "Some Accelerator 9000"
    trace = str(tmp_path / "unknown_gpu.json")
    Path(trace).write_text(json.dumps(doc), encoding="utf-8")
    why = "the Some Accelerator 9000 is not in layerscope's datasheet table"
    done = run_cli("show", trace, "--depth", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"MFU unknown: {why} (--peak-tflops gives one)" in done.stdout.splitlines()
    line = assert_usage_error(run_cli("show", trace, "--columns", "mfu", cwd=tmp_path))
    assert line.startswith(
        f"layerscope: error: no column 'mfu' (MFU needs the hardware's peak FLOP/s: {why}; give --peak-tflops); it has: "
    ), line


#: The figures of a node's phase that are times (and calls): what a trace read without its
#: shapes must give exactly as the full read does.
_TIMES = ("cpu_time_ns", "self_cpu_time_ns", "device_time_ns", "self_device_time_ns", "comm_time_ns", "self_comm_time_ns")


def _times(profile: Any) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (node.path, phase): (node.calls, *(getattr(stats, name) for name in _TIMES))
        for node in profile.nodes()
        for phase, stats in node.phases()
    }


@pytest.mark.parametrize("name", tiered(ALL_TRACES))
def test_a_trace_read_without_its_shapes_has_the_full_reads_times(shared_traces: Path, name: str) -> None:
    """``shapes=False`` (``--no-shapes``) reads each op as one row where a module called
    it, uncounted: every node's times, calls and communication time, the step's time and
    the device ledger are the full read's to the nanosecond, on every real trace, and so
    are what forwards kept for backward, the gradients and the run's peak. A module's
    allocations and peak are read at the rows' grain: a temporary that lives only inside
    one row (``aten::linear``'s, between its parts) is not seen, so they are never more
    than the full read's. FLOPs are unknown, with the reason, never 0. (A backward node's
    time before a label inside it, and a compiled region's or custom op's kernels, are
    where the two reads once disagreed: the compiled GPT-2 and B200 traces.)"""
    full = _trace(shared_traces, name)
    light = load_trace(shared_traces / f"{name}.json.gz", shapes=False)
    assert tree_problems(light) == []
    assert _times(light) == _times(full)
    assert light.step_time_ns == full.step_time_ns
    assert light.device == full.device
    assert light.meta.device_events == full.meta.device_events
    assert (light.memory is None) == (full.memory is None)
    if full.memory is not None:
        assert light.memory.peak_bytes == full.memory.peak_bytes
    for ours, theirs in zip(light.nodes(), full.nodes(), strict=True):
        for (phase, a), (_, b) in zip(ours.phases(), theirs.phases(), strict=True):
            where = (ours.path, phase)
            assert (a.activation_bytes, a.grad_bytes) == (b.activation_bytes, b.grad_bytes), where
            for field in ("alloc_bytes", "self_alloc_bytes", "peak_bytes"):
                mine, whole = getattr(a, field), getattr(b, field)
                assert (mine is None) == (whole is None), where
                assert mine is None or mine <= whole, (where, field)
    # Nothing counted is shown as 0: op rows' counts and collectives' bytes are unknown.
    assert all(op.flops is None and op.macs is None and op.bytes is None for node in light.nodes() for op in node.ops)
    assert all(stats.comm_bytes is None for node in light.nodes() for _, stats in node.phases())
    if full.meta.source.record_shapes:
        assert light.root.forward.flops is None
        assert light.meta.flops_unknown == "the trace was read without its recorded shapes (shapes=False / --no-shapes)"
        assert "FLOPs unknown: the trace was read without its recorded shapes" in light.render("text")
    # What the file recorded is still said as recorded.
    assert light.meta.source == full.meta.source


def test_load_takes_shapes_false_for_traces_alone(shared_traces: Path, tmp_path: Path) -> None:
    saved = tmp_path / "p.json"
    _trace(shared_traces, "h100_bert_small_inference").save(saved)
    with pytest.raises(ValueError, match=r"shapes=False leaves out the shapes of a torch.profiler trace file; .* is not one"):
        layerscope.load(saved, shapes=False)
    with pytest.raises(FileNotFoundError, match="no such profile file"):
        layerscope.load(tmp_path / "missing.json.gz", shapes=False)
    with pytest.raises(TypeError, match="shapes must be True or False, got 'no'"):
        layerscope.load(shared_traces / "h100_bert_small_inference.json.gz", shapes="no")  # type: ignore[arg-type]


def test_a_trace_load_reports_how_far_its_read_and_build_are(shared_traces: Path) -> None:
    """``progress(stage, done, total)`` hears the read in KiB of the file as stored, from
    0 to the file's size, never backwards, then each step walked; what it shows is the
    profile an unreported load gives."""
    from layerscope.traces.load import BUILD_STAGE, READ_STAGE, REPORT_EVERY

    path = shared_traces / "mi300x_resnet_ddp_actckpt_train_rank0.json.gz"  # 56,451 events
    heard: list[tuple[str, int, int]] = []
    profile = layerscope.load(path, progress=lambda stage, done, total: heard.append((stage, done, total)))
    reads = [(done, total) for stage, done, total in heard if stage == READ_STAGE]
    kib = path.stat().st_size // 1024
    assert reads[0] == (0, kib) and reads[-1] == (kib, kib)
    assert len(reads) == 2 + 56_451 // REPORT_EVERY
    assert [done for done, _ in reads] == sorted(done for done, _ in reads)
    builds = [(done, total) for stage, done, total in heard if stage == BUILD_STAGE]
    steps = profile.figures.steps
    assert steps == 3 and builds == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert heard.index((BUILD_STAGE, 0, 3)) > heard.index((READ_STAGE, kib, kib))
    assert profile.to_dict() == _trace(shared_traces, "mi300x_resnet_ddp_actckpt_train_rank0").to_dict()


@pytest.mark.slow  # two cold command lines
def test_show_of_a_trace_draws_a_bar_on_a_terminal_and_none_elsewhere(shared_traces: Path, tmp_path: Path) -> None:
    """With stderr a terminal (a pseudo-terminal here), ``show`` of a trace draws its
    read and build as progress bars there, gone when done; the table on stdout is the
    same as with stderr a pipe, where nothing is drawn."""
    import os
    import pty
    import select
    import subprocess
    import sys

    trace = str(shared_traces / "h100_bert_small_inference.json.gz")
    argv = [sys.executable, "-m", "layerscope", "show", trace, "--depth", "1"]
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    master, slave = pty.openpty()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, env=env, cwd=tmp_path)
    os.close(slave)
    drawn = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            drawn += chunk
        elif child.poll() is not None:
            break
    shown = child.stdout.read().decode() if child.stdout else ""
    assert child.wait() == 0
    os.close(master)
    assert b"reading the trace (KiB)" in drawn and b"building the tree (steps)" in drawn
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    assert piped.stderr == "" and shown == piped.stdout


def test_figures_a_trace_does_not_have_are_unknown_in_every_view_that_names_them(shared_traces: Path) -> None:
    """FLOPs of a trace recorded without shapes (the A100 one), or read without them,
    are unknown wherever they would be shown: DeepSpeed's printout says ``?`` (and its
    FLOPS), never 0, and a FLOP sort or flamegraph says why there are none."""
    from layerscope.base.errors import LayerscopeError

    recorded = _trace(shared_traces, "a100_alexnet_no_modules")
    read = load_trace(shared_traces / "h100_bert_small_inference.json.gz", shapes=False)
    for profile in (recorded, read):
        printout = profile.render("deepspeed")
        flops_lines = [line for line in printout.splitlines() if line.startswith(("fwd flops", "fwd FLOPS", "FLOPS per GPU"))]
        assert flops_lines and all(line.rstrip().endswith(("?", "? FLOPS")) for line in flops_lines), flops_lines
        reason = profile.meta.flops_unknown
        assert reason
        with pytest.raises(LayerscopeError, match=re.escape(f"the profile has no FLOP counts: {reason}")):
            profile.ops(sort_by="flops")
        with pytest.raises(LayerscopeError, match=re.escape(f"this profile has no flops to export: {reason}")):
            profile.render("folded", metric="flops")
