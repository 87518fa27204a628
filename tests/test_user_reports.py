"""Inputs users report against this field's profilers, each with its right value worked
out independently: what layerscope says of them.

- Lazy modules (torchinfo and fvcore reports: ``LazyLinear`` before its first forward
  has no parameter sizes): one line saying so and what to do, the model untouched, and
  after the first forward the counts of an eager model of the same sizes.
- Higher-order ops, forwards that call autograd or yield, ops users run that had no
  formula (the fused encoder layer, weight norm, FFT, interpolation modes, ROCm's batch
  norm), counts that leave something out shown as partial.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope.base.errors import ModelError


def _lazy() -> nn.Module:
    return nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))


def _eager() -> nn.Module:
    """The same sizes as :func:`_lazy` after a forward of a 1 x 3 x 8 x 8 input."""
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))


X = torch.randn(1, 3, 8, 8)


@pytest.mark.parametrize(
    "entry",
    [
        lambda m: layerscope.count_flops(m, X),
        lambda m: layerscope.profile(m, X, warmup=0, repeat=1),
        lambda m: layerscope.Profiler(m).__enter__(),
    ],
    ids=["count_flops", "profile", "Profiler"],
)
def test_a_lazy_module_not_yet_run_is_refused_in_one_line_and_left_as_it_was(entry: Any) -> None:
    model = _lazy()
    before = {k: type(v) for k, v in model.state_dict(keep_vars=True).items()}
    with pytest.raises(ModelError) as refused:
        entry(model)
    assert str(refused.value) == (
        "LazyConv2d at '0' is a lazy module whose parameters are not made yet (its first forward makes them): "
        "run the model once on an input, then profile it"
    )
    assert {k: type(v) for k, v in model.state_dict(keep_vars=True).items()} == before
    assert not torch.nn.modules.module._global_forward_pre_hooks


def test_a_lazy_module_after_its_first_forward_counts_as_the_eager_one() -> None:
    lazy = _lazy().eval()
    with torch.no_grad():
        lazy(X)
    eager = _eager().eval()
    mine, theirs = layerscope.count_flops(lazy, X), layerscope.count_flops(eager, X)
    # Conv 4 x 3 x 3 x 3 weights + 4 biases = 112, BatchNorm 2 x 4 = 8, Linear 144 x 2 + 2 = 290.
    assert mine.root.params_total == theirs.root.params_total == 112 + 8 + 290
    assert [(n.path, n.forward.flops) for n in mine.modules()] == [(n.path, n.forward.flops) for n in theirs.modules()]


@pytest.mark.slow
def test_a_lazy_model_on_the_command_line_is_a_usage_error_not_the_models(tmp_path: Any) -> None:
    from processes import run_layerscope

    (tmp_path / "lazy_model.py").write_text(
        "import torch\nfrom torch import nn\n\ndef build():\n    return nn.Sequential(nn.LazyLinear(4), nn.ReLU())\n"
    )
    done = run_layerscope(["flops", "lazy_model.py:build", "--input", "2x8"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "layerscope: error: LazyLinear at '0' is a lazy module whose parameters are not made yet (its first forward "
        "makes them): run the model once on an input, then profile it"
    ]


def test_a_trace_of_backward_alone_recorded_with_stacks_does_not_advise_recording_them(tmp_path: Any) -> None:
    """Recorded with ``with_stack=True`` around ``loss.backward()`` alone: no module's
    forward ran, so there is no module event; the footer says that, not "record it with
    with_stack=True" (it was)."""
    from torch.profiler import profile

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    loss = model(torch.randn(2, 4)).sum()
    with profile(with_stack=True, record_shapes=True) as prof:
        loss.backward()
    prof.export_chrome_trace(str(tmp_path / "backward.json"))
    text = layerscope.load(tmp_path / "backward.json").render("text")
    assert "record it with with_stack=True" not in text
    assert (
        "Modules: none recorded (the trace has Python events but no nn.Module call: no module's forward ran while "
        "it recorded, as around loss.backward() alone)"
    ) in text


# -- step parts named for what they are: <loss> only before the backward it feeds ----------


def _parts(run: Any) -> tuple[list[str], int]:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with layerscope.Profiler(model) as prof:
        run(model)
    profile = prof.profile
    return [part.path for part in profile.parts if part.kind != "overhead"], profile.root.calls


def test_work_after_a_forward_with_no_backward_is_not_called_the_loss() -> None:
    """``with torch.no_grad(): y = m(x); y.sum()`` in a block: the sum feeds no backward."""

    def run(model: nn.Module) -> None:
        with torch.no_grad():
            model(torch.randn(2, 8)).sum()

    assert _parts(run) == (["<other>"], 1)


def test_a_generation_loops_work_between_model_calls_is_its_own_part() -> None:
    """A decode loop (the model called three times, its logits turned into the next
    input between calls): the work between calls is ``<between calls>``, each call a call
    of the root, and nothing is ``<loss>``."""

    def run(model: nn.Module) -> None:
        h = torch.randn(2, 8)
        with torch.no_grad():
            for _ in range(3):
                h = model(h).softmax(-1) * 2

    parts, calls = _parts(run)
    assert (sorted(parts), calls) == (["<between calls>", "<other>"], 3)


def test_the_loss_is_still_the_loss_in_a_training_step() -> None:
    def run(model: nn.Module) -> None:
        model(torch.randn(2, 8)).sum().backward()

    parts, calls = _parts(run)
    assert parts[0] == "<loss>" and calls == 1 and "<between calls>" not in parts


@pytest.mark.slow
def test_generate_of_a_small_gpt2_files_its_decode_logic_between_calls() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 64, (1, 4))
    with layerscope.Profiler(model) as prof:
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    profile = prof.profile
    parts = [part.path for part in profile.parts]
    assert "<loss>" not in parts and "<between calls>" in parts
    assert profile.root.calls == 4  # one forward per new token


def test_optimizer_ops_whose_shapes_a_trace_left_out_are_unknown_not_zero(shared_traces: Any) -> None:
    """The H100 GPT-2 AdamW trace writes the ``_foreach_*`` ops' tensor lists as ``[]``
    (Kineto leaves long lists out): their FLOPs are unknown, listed, never counted as 0."""
    profile = layerscope.load(shared_traces / "h100_gpt2_adamw_train.json.gz")
    assert profile.unsupported_ops() == {
        "aten::_foreach_add_": 2, "aten::_foreach_addcdiv_": 1, "aten::_foreach_addcmul_": 1, "aten::_foreach_div_": 1,
        "aten::_foreach_lerp_": 1, "aten::_foreach_mul_": 2, "aten::_foreach_sqrt": 1,
    }
    rows = [row for row in profile.ops(module="<optimizer:AdamW>") if row.name.startswith("aten::_foreach")]
    assert rows and all(row.flops is None for row in rows)
    assert "Ops not counted in FLOPs (no formula, or their shapes not recorded): aten::_foreach_add_ x2" in profile.render("text")


def test_a_trace_with_no_module_call_says_its_model_flops_are_unknown_not_zero(shared_traces: Any) -> None:
    """The compiled GPT-2 training trace has no module events: its graphs are labels, so
    the model's FLOPs are unknown, and the footer names what the step's parts counted."""
    profile = layerscope.load(shared_traces / "h100_compiled_gpt2_train.json.gz")
    text = profile.render("text", depth=0)
    assert "FLOPs: 0" not in text and "Model FLOPs: forward 0" not in text
    assert "FLOPs: ? (no module call in the tree)" in text
    forward = sum(p.forward.flops or 0 for p in profile.parts)
    backward = sum((p.backward.flops or 0) if p.backward is not None else 0 for p in profile.parts)
    assert forward > 3.9e9 and backward > 7.8e9  # the graphs' 3.90G forward (and the optimizer's), 7.86G backward


def test_dynamically_quantized_weights_are_counted_at_their_stored_size_not_zero() -> None:
    """``quantize_dynamic`` keeps each Linear's weight packed, outside its parameters:
    counted at its stored size (qint8, 1 byte an element; the bias float32), never 0 B."""
    import warnings

    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        profile = layerscope.count_flops(quantized, torch.randn(2, 16))
    # Weights 16 x 8 + 8 x 4 = 160 elements, 1 byte each; biases 8 + 4 float32, 48 bytes.
    assert (profile["0"].params, profile["2"].params) == (16 * 8 + 8, 8 * 4 + 4)
    assert profile.root.params_total == 172
    assert profile.param_bytes == 160 + 48
    assert "Memory: parameters 48 B float32, 160 B qint8" in profile.render("text")


# -- higher-order ops: counted the same way by count_flops, profile() and blocks --


class _Flex(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v)


class _Cond(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))


class _WhileLoop(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.while_loop import while_loop

        return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x.sin()), (torch.tensor(0), x))[1]


class _Map(nn.Module):
    def forward(self, xs: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.map import map as map_op

        return map_op(lambda x, w: x @ w, xs, w)


@pytest.mark.slow
def test_count_flops_counts_flex_attention_as_profile_does_and_leaves_torch_working() -> None:
    """``flex_attention`` runs through torch.compile even eagerly, and torch.compile
    refuses a user's dispatch mode (torch's own FlopCounterMode fails on it too), so
    count_flops counts such a model from torch's profiler's ops, as profile() does; the
    failed compile is cleared, so the user's own calls still run."""
    import warnings

    q, k, v = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's "called without torch.compile()"
        counted = layerscope.count_flops(_Flex(), (q, k, v))
        assert _Flex()(q, k, v).shape == (1, 2, 16, 8)  # torch's own call still works
        profile = layerscope.profile(_Flex(), (q, k, v), warmup=0, repeat=1)
    # Q K^T and P V: 1 * 2 * 16 * 16 * 8 multiply-accumulates each.
    assert counted.root.forward.macs == profile.root.forward.macs == 2 * (1 * 2 * 16 * 16 * 8)
    assert counted.meta.timed is False


def _op_flops(profile: layerscope.Profile) -> dict[str, tuple[int, int | None]]:
    return {row.name: (row.calls, row.flops) for row in profile.ops() if row.flops}


def test_cond_while_loop_and_map_are_counted_from_the_ops_that_run() -> None:
    """Eager ``cond``, ``while_loop`` and ``map`` compile their bodies: the ops counted are
    those run (the branch taken, each iteration once), not those torch.compile traces."""
    x = torch.ones(4, 4)  # sum > 0: the sin branch, 16 elements
    counted = _op_flops(layerscope.count_flops(_Cond(), x))
    assert counted == {"aten::sum": (1, 16), "aten::gt": (1, 1), "aten::sin": (1, 16)}
    assert counted == _op_flops(layerscope.profile(_Cond(), x, warmup=0, repeat=1))
    # Three iterations: three sin of 16 elements, three adds, four tests of i < 3.
    counted = _op_flops(layerscope.count_flops(_WhileLoop(), x))
    assert counted == {"aten::sin": (3, 48), "aten::add": (3, 3), "aten::lt": (4, 4)}
    # Three 4x4 @ 4x4 products: 3 * 4 * 4 * 4 MACs, 2 FLOPs each.
    counted = _op_flops(layerscope.count_flops(_Map(), (torch.randn(3, 4, 4), torch.randn(4, 4))))
    assert counted == {"aten::mm": (3, 3 * 2 * 4 * 4 * 4)}


def test_a_higher_order_op_under_a_users_own_profiler_is_refused_in_one_line() -> None:
    from layerscope.base.errors import DispatchModeError

    with torch.profiler.profile(), pytest.raises(DispatchModeError) as refused:
        layerscope.count_flops(_Cond(), torch.ones(4, 4))
    assert str(refused.value) == (
        "the model calls cond, a higher-order op that a dispatch mode cannot run (torch.compile runs it even "
        "eagerly, and refuses user dispatch modes); count_flops counts such a model from torch's profiler, "
        "which another profiler in this process holds now"
    )
    assert torch.cond(torch.tensor(True), lambda x: x.sin(), lambda x: x.cos(), (torch.ones(2),)).shape == (2,)


@pytest.mark.parametrize("how", ["script", "trace"])
def test_modules_inside_torchscript_are_unknown_with_a_line_saying_why(how: str) -> None:
    """``torch.jit.script`` / ``trace``: the scripted root calls its submodules without
    Python, so no hook sees them. They are shown unknown (not profiled), never 0 calls
    and 0 ns, and the footer says why; their work is the root's."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(2, 8)
    scripted = torch.jit.script(model) if how == "script" else torch.jit.trace(model, x)
    profile = layerscope.count_flops(scripted, x)
    assert [node.profiled for node in profile.modules()] == [True, False, False, False]
    assert profile.meta.unseen == ["0", "1", "2"]
    # Two Linears: 2 * 8 * 8 + 2 * 8 * 2 = 160 MACs, all on the root.
    assert profile.root.forward.macs == 160
    text = profile.render("text")
    assert (
        "Not seen: 3 modules called from TorchScript (0, 1, 2): no hook sees into scripted code, so their figures "
        "are unknown and their work is their scripted caller's"
    ) in text


# -- a forward that calls autograd itself: run with gradients, and said --


class _GradientPenalty(nn.Module):
    """A gradient penalty's shape: the forward differentiates its own output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.detach().requires_grad_()
        energy = self.linear(x).pow(2).sum()
        (grad,) = torch.autograd.grad(energy, x, create_graph=True)
        return grad.norm()


@pytest.mark.parametrize("entry", ["count_flops", "profile"])
def test_a_forward_that_calls_autograd_runs_with_gradients_and_says_so(entry: str) -> None:
    """Under the default no_grad such a forward fails inside torch; layerscope runs it
    again with gradients on, with a warning. Its Linear: 4 x 6 x 5 = 120 MACs forward,
    and the gradient to x, 4 x 5 x 6 = 120 MACs, in its backward phase."""
    from layerscope.base.errors import LayerscopeWarning
    from test_no_side_effects import assert_unchanged, snapshot

    model, x = _GradientPenalty(), torch.randn(4, 6)
    before = snapshot(model)
    with pytest.warns(LayerscopeWarning, match="the model's forward needs gradients"):
        if entry == "count_flops":
            profile = layerscope.count_flops(model, x)
        else:
            profile = layerscope.profile(model, x, warmup=0, repeat=1)
    assert_unchanged(before, snapshot(model))
    linear = profile["linear"]
    assert linear.forward.macs == 120
    assert linear.backward is not None and linear.backward.macs == 120
    assert profile.meta.no_grad is False


def test_a_forward_that_calls_autograd_under_an_explicit_no_grad_raises_torchs_error() -> None:
    with pytest.raises(RuntimeError, match="does not require grad"):
        layerscope.count_flops(_GradientPenalty(), torch.randn(4, 6), no_grad=True)


# -- ops users run that had no formula: counted, each by hand --


def _flops_by_op(profile: layerscope.Profile) -> dict[str, int | None]:
    return {row.name: row.flops for row in profile.ops() if row.flops != 0}


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_the_fused_encoder_layer_counts_as_its_unfused_ops_do(activation: str, norm_first: bool) -> None:
    """``nn.TransformerEncoderLayer`` in eval under no_grad runs one fused op; with
    gradients on, the same layer runs its unfused ops, each counted by its own formula.
    By hand (B=2, L=5, E=16, 4 heads, F=32; N = 10 tokens): MACs = 4·N·E² (q, k, v, out
    projections) + 2·B·L²·E (scores and values) + 2·N·E·F (feed-forward) = 10,240 +
    1,600 + 10,240 = 22,080; FLOPs = 2·MACs + 640 (projection biases) + 600 (softmax,
    3 per score) + 480 (feed-forward biases) + 320 (activation) + 2,240 (two layer
    norms, 7 per element) + 320 (two residual adds) = 48,760."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, activation=activation, norm_first=norm_first)
    x = torch.randn(2, 5, 16)
    fused = layerscope.count_flops(layer.eval(), x)
    assert list(_flops_by_op(fused)) == ["aten::_transformer_encoder_layer_fwd"]
    unfused = layerscope.count_flops(layer, x, no_grad=False)
    assert "aten::_transformer_encoder_layer_fwd" not in _flops_by_op(unfused)
    assert (fused.root.forward.flops, fused.root.forward.macs) == (unfused.root.forward.flops, unfused.root.forward.macs)
    assert (fused.root.forward.flops, fused.root.forward.macs) == (48_760, 22_080)
    assert fused.unsupported_ops() == {}


def test_weight_norm_fft_and_interpolation_modes_are_counted_by_hand() -> None:
    """weight_norm of a 4x6 Linear: 3 per element of v (24) + 2 per norm (4) = 80.
    FFT (5·n·log2 n per complex transform, half for a real one; a normalised transform
    adds 1 per output element): rfft of 3 x 16 points 3 · 160 = 480; irfft back to 16
    points 480 + 48 (by 1/n) = 528; a complex fft of 3 x 8 with norm="ortho" 3 · 120 +
    24 = 384. Nearest-exact interpolation is free; bicubic with antialias, 32 per output
    (1·2·6·6 = 72 outputs): 2,304."""
    import torch.nn.functional as F

    linear = nn.utils.parametrizations.weight_norm(nn.Linear(6, 4))
    assert _flops_by_op(layerscope.count_flops(linear, torch.randn(3, 6)))["aten::_weight_norm_interface"] == 80

    class Spectral(nn.Module):
        def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.fft.irfft(torch.fft.rfft(x), n=16), torch.fft.fft(z, norm="ortho")

    counted = layerscope.count_flops(Spectral(), (torch.randn(3, 16), torch.randn(3, 8, dtype=torch.complex64)))
    assert _flops_by_op(counted) == {"aten::_fft_r2c": 480, "aten::_fft_c2r": 528, "aten::_fft_c2c": 384}

    class Resize(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (F.interpolate(a, scale_factor=2, mode="nearest-exact"),
                    F.interpolate(c, scale_factor=2, mode="nearest-exact"),
                    F.interpolate(b, size=(6, 6), mode="bicubic", antialias=True))

    counted = layerscope.count_flops(Resize(), (torch.randn(1, 2, 4), torch.randn(1, 2, 4, 4), torch.randn(1, 2, 2, 2, 2)))
    assert _flops_by_op(counted) == {"aten::_upsample_bicubic2d_aa": 2304}
    assert counted.unsupported_ops() == {}


def test_a_count_that_leaves_out_ops_without_a_formula_is_shown_as_partial() -> None:
    """``nn.Bilinear`` runs ``aten::_trilinear``, which has no formula: its row and every
    row above it show what was counted with ``+ ?`` (``?`` where nothing was), in the
    text tree, its footer and the HTML report alike; a row whose count is complete is
    shown plain."""

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.bilinear = nn.Bilinear(4, 4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x)
            return self.bilinear(y, y)

    profile = layerscope.count_flops(Head(), torch.randn(3, 4))
    rows = {line.split("|")[0].strip(" ├└─│"): [cell.strip() for cell in line.split("|")]
            for line in profile.render("text").splitlines() if "|" in line}
    header = rows["Module"]
    flops, macs = header.index("FLOPs"), header.index("MACs")
    # The Linear: 3 x 4 x 4 = 48 MACs, 96 + 12 (bias) = 108 FLOPs, complete.
    assert (rows["linear"][flops], rows["linear"][macs]) == ("108", "48")
    # The Bilinear's bias add, 3 x 2 = 6 FLOPs, is counted; its products are not.
    assert (rows["bilinear"][flops], rows["bilinear"][macs]) == ("6 + ?", "?")
    assert (rows["Head"][flops], rows["Head"][macs]) == ("114 + ?", "48 + ?")
    assert "FLOPs: 114 + ?   MACs: 48 + ?" in profile.render("text")
    assert profile.root.flops_partial and not profile["linear"].flops_partial
    from layerscope.render.html import report_data

    partial = {node["path"]: node["flops_partial"] for node in report_data(profile)["nodes"]}
    assert partial == {"": True, "linear": False, "bilinear": True}


def test_a_forward_that_yields_is_said_to_run_outside_the_pass() -> None:
    class Streaming(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> Any:
            for row in x:
                yield self.linear(row)

    from layerscope.base.errors import LayerscopeWarning

    with pytest.warns(LayerscopeWarning, match="the model's forward returned a generator: its work runs when"):
        profile = layerscope.count_flops(Streaming(), torch.randn(2, 4))
    assert profile["linear"].calls == 0


def test_rocm_batch_norm_backward_and_list_inputs_of_free_ops_are_counted_in_real_traces(shared_traces: Path) -> None:
    """The MI300X norm-layers trace runs ``miopen_batch_norm_backward`` 6 times on
    inputs of 1x128x32x32 and 8x16x32x32 (131,072 elements each), counted as every
    norm's backward is, 12 per input element: 6 x 1,572,864. The ResNet DDP trace's
    ``cat`` calls take lists, whose shapes a trace does not record; ``cat`` does no
    arithmetic, so it is free, not unknown."""
    norms = layerscope.load(shared_traces / "mi300x_norm_layers_fwd_bwd.json.gz")
    assert norms.unsupported_ops() == {}
    rows = [row for row in norms.ops() if row.name == "aten::miopen_batch_norm_backward"]
    assert sum(row.calls for row in rows) == 6
    assert sum(row.flops or 0 for row in rows) == 6 * 12 * 131_072
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resnet = layerscope.load(shared_traces / "mi300x_resnet_ddp_actckpt_train_rank0.json.gz")
    assert "aten::cat" not in resnet.unsupported_ops()


def test_a_trace_of_one_op_is_read_and_its_footer_names_only_the_phases_it_ran(tmp_path: Path) -> None:
    """One 7.9 ms ``aten::mm`` of 64x64 by 64x64, no step, no module: read (never "no
    op"), its 64^3 = 262,144 MACs in the step's ``<other>``, the model's figures unknown,
    and no backward named where none ran."""
    import json

    path = tmp_path / "one.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [{
        "ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 100, "dur": 7900, "pid": 1, "tid": 1,
        "args": {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]},
    }]}))
    profile = layerscope.load(path)
    other = next(part for part in profile.parts if part.path == "<other>")
    assert (other.forward.macs, other.forward.self_cpu_time_ns) == (262_144, 7_900_000)
    text = profile.render("text")
    assert "Model FLOPs: ? (no module call in the tree); the step's parts hold forward 524.29K\n" in text
    assert "Forward CPU total: ?" in text


def test_a_json_array_is_said_to_be_neither_a_document_nor_a_trace(tmp_path: Path) -> None:
    from layerscope.base.errors import SchemaError

    path = tmp_path / "events.json"
    path.write_text('[{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]')
    with pytest.raises(SchemaError) as refused:
        layerscope.load(path)
    assert str(refused.value) == (
        f"{str(path)!r} is neither a layerscope profile nor a torch.profiler trace: its JSON is an array, where "
        "both are an object (a document's 'schema', a trace's 'traceEvents')"
    )
