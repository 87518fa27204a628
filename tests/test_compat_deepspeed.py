"""``layerscope.compat.deepspeed``: DeepSpeed's flops profiler API on layerscope's numbers.

The seed script (seeds/002) runs first, with the zoo's AlexNet in place of torchvision's;
then goldens of every printout with a fake clock (LeNet-5, whose figures are worked out
by hand below), the old and new call styles, and the no-side-effect snapshot.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from conftest import FakeClock
from layerscope import zoo
from layerscope.base.errors import ProfilerStateError
from layerscope.compat.deepspeed import FlopsProfiler, get_model_profile
from layerscope.model.check import check_tree
from test_no_side_effects import X4, Failing, assert_unchanged, everything, snapshot

# AlexNet's MACs at 1x3x224x224, per conv and linear layer (out positions x kernel x in x out):
ALEXNET_MACS = (
    55 * 55 * 11 * 11 * 3 * 64  # features.0:  70,276,800
    + 27 * 27 * 5 * 5 * 64 * 192  # features.3: 223,948,800
    + 13 * 13 * 3 * 3 * 192 * 384  # features.6: 112,140,288
    + 13 * 13 * 3 * 3 * 384 * 256  # features.8: 149,520,384
    + 13 * 13 * 3 * 3 * 256 * 256  # features.10: 99,680,256
    + 9216 * 4096 + 4096 * 4096 + 4096 * 1000  # classifier.1, .4, .6: 58,621,952
)

# Its FLOPs besides 2 per MAC, by the rules of docs/flops.md, at 1x3x224x224 in eval():
# each conv's bias and ReLU, 1 per output element (64x55x55, 192x27x27, 384x13x13 and
# twice 256x13x13: 484,992 each); three 3x3 max pools, 9 per output element (64x27x27,
# 192x13x13, 256x6x6: 794,880); the adaptive average pool, 1 per input element (9,216);
# the Linears' biases (4,096 + 4,096 + 1,000) and two ReLUs (8,192). In train() on the
# CPU each of the two dropouts runs as bernoulli_ (free), div_ and mul: 2 per element
# (9,216 + 4,096 elements).
ALEXNET_OTHER_FLOPS = 2 * 484_992 + 794_880 + 9_216 + 9_192 + 8_192
ALEXNET_DROPOUT_FLOPS = 2 * (9_216 + 4_096)
ALEXNET_PARAMS = 61_100_840

# LeNet-5 (zoo layout) at 1x1x32x32: conv 1->6 5x5 on 28x28 out, conv 6->16 5x5 on 10x10 out,
# then 400->120, 120->84, 84->10.
LENET_MACS = 28 * 28 * 25 * 6 + 10 * 10 * 150 * 16 + 400 * 120 + 120 * 84 + 84 * 10  # 416,520
LENET_PARAMS = 156 + 2416 + 48120 + 10164 + 850  # 61,706
# FLOPs: 2 per MAC; one add per output for each bias (convs' and linears' outputs); one
# per tanh output (after both convs and the first two linears); 4 adds per 2x2 average.
LENET_FLOPS = (
    2 * LENET_MACS  # 833,040
    + 6 * 28 * 28 + 16 * 10 * 10 + 120 + 84 + 10  # bias: 6,518
    + 6 * 28 * 28 + 16 * 10 * 10 + 120 + 84  # tanh: 6,508
    + 6 * 14 * 14 * 4 + 16 * 5 * 5 * 4  # avg_pool2d: 6,304
)  # 852,370


@pytest.fixture(scope="module")
def alexnet() -> nn.Module:
    return zoo.get("alexnet").build()


def lenet() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    entry = zoo.get("lenet5")
    return entry.build(), entry.example_inputs(1)


def _value(text: str, label: str) -> str:
    """The value printed after ``label`` in the summary."""
    match = re.search(rf"^{re.escape(label)}\s+(.+)$", text, flags=re.M)
    assert match, f"{label!r} not printed"
    return match.group(1)


# -- the seed's script ----------------------------------------------------------------


def test_seed_high_level_api(alexnet: nn.Module, capsys: pytest.CaptureFixture[str]) -> None:
    # The seed's call, keyword for keyword (warm_up=1 instead of 10: timing is not the point).
    macs, params = get_model_profile(
        alexnet,
        (3, 224, 224),
        input_constructor=None,
        print_profile=True,
        print_aggregated_profile=True,
        depth=-1,
        top_num=3,
        warm_up=1,
        as_strings=True,
        ignore_modules=None,
    )
    print("{:<30}  {:<8}".format("Number of multiply-adds: ", macs))
    print("{:<30}  {:<8}".format("Number of parameters: ", params))
    out = capsys.readouterr().out
    assert (macs, params) == ("714.19 MMACs", "61.1 M")
    assert ALEXNET_MACS == 714_188_480
    assert "Number of multiply-adds:        714.19 MMACs" in out
    assert _value(out, "fwd MACs per GPU:") == "714.19 MMACs"
    assert _value(out, "params per GPU:") == "61.1 M"
    assert "Top 3 modules in terms of params, MACs or fwd latency" in out
    assert "    MACs        - {'Conv2d': '655.57 MMACs', 'Linear': '58.62 MMACs'," in out
    # The annotated tree: AlexNet's modules in order, each with its share of the MACs.
    assert "    (0): Conv2d(23.3 K = 0.04% Params, 70.28 MMACs = 9.84% MACs, " in out
    assert "    (6): Linear(4.1 M = 6.71% Params, 4.1 MMACs = 0.57% MACs, " in out
    assert [m.group(1) for m in re.finditer(r"^ +\((\w+)\): ", out, flags=re.M)] == [
        "features", *map(str, range(13)), "avgpool", "classifier", *map(str, range(7))
    ]


def test_today_signature_returns_flops_macs_params(alexnet: nn.Module) -> None:
    flops, macs, params = get_model_profile(
        alexnet, input_shape=(1, 3, 224, 224), print_profile=False, as_string=False
    )
    assert macs == ALEXNET_MACS
    assert params == ALEXNET_PARAMS == sum(p.numel() for p in alexnet.parameters())
    assert flops == 2 * macs + ALEXNET_OTHER_FLOPS == 1_430_168_424
    assert get_model_profile(alexnet, input_shape=(1, 3, 224, 224), print_profile=False)[1:] == (
        "714.19 MMACs",
        "61.1 M",
    )


def test_seed_low_level_api_in_a_training_loop(alexnet: nn.Module, capsys: pytest.CaptureFixture[str]) -> None:
    # The seed's loop: profile the forward of step `profile_step`, print, end, then train on.
    optimizer = torch.optim.SGD(alexnet.parameters(), lr=0.0)
    batch = torch.rand(1, 3, 224, 224)
    prof = FlopsProfiler(alexnet)
    profile_step = 1
    for step in range(2):
        if step == profile_step:
            prof.start_profile()
        loss = alexnet(batch).sum()
        if step == profile_step:
            flops = prof.get_total_flops()
            macs = prof.get_total_macs()
            duration = prof.get_total_duration()
            params = prof.get_total_params(as_string=True)
            prof.print_model_profile(profile_step=profile_step)
            prof.print_model_aggregated_profile(module_depth=-1, top_modules=3)
            prof.end_profile()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    out = capsys.readouterr().out
    assert macs == ALEXNET_MACS and params == "61.1 M"
    assert flops == 2 * macs + ALEXNET_OTHER_FLOPS + ALEXNET_DROPOUT_FLOPS and duration > 0
    assert "Profile Summary at step 1:" in out
    assert "bwd latency:" not in out  # the window closed before backward
    assert "Top 3 modules in terms of params, MACs or fwd latency" in out


def test_tutorial_call_with_args_and_kwargs_none(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSpeed's tutorial call, keyword for keyword: args=None and kwargs=None mean none.
    model, _ = lenet()
    flops, macs, params = get_model_profile(
        model=model, input_shape=(4, 1, 32, 32), args=None, kwargs=None, print_profile=True, detailed=True,
        module_depth=-1, top_modules=1, warm_up=10, as_string=True, output_file=None, ignore_modules=None,
    )
    # Batch 4: 4 x LeNet-5's 416,520 MACs, and 4 x its 852,370 FLOPs (2 per MAC, plus
    # 6,518 bias adds, 6,508 tanh and 6,304 pooling adds, worked out in LENET_FLOPS).
    assert 4 * LENET_MACS == 1_666_080 and 4 * LENET_FLOPS == 3_409_480
    assert (flops, macs, params) == ("3.41 M", "1.67 MMACs", "61.71 K")
    out = capsys.readouterr().out
    assert "Profile Summary at step 10:" in out and _value(out, "fwd MACs per GPU:") == "1.67 MMACs"
    # args given, kwargs None (and the other way round) count the same.
    x = torch.ones(4, 1, 32, 32)
    assert get_model_profile(model, args=[x], kwargs=None, print_profile=False, as_string=False)[1] == 4 * LENET_MACS
    pair = Pair()
    assert get_model_profile(
        pair, args=None, kwargs={"x": torch.ones(2, 4), "y": torch.ones(2, 4)}, print_profile=False, as_string=False
    )[1] == 2 * 2 * 4 * 3
    with pytest.raises(ValueError, match=r"^give input_shape, or args and/or kwargs, for the model's input$"):
        get_model_profile(model, input_shape=None, args=None, kwargs=None)


# -- goldens --------------------------------------------------------------------------


def test_golden_get_model_profile(capsys: pytest.CaptureFixture[str], golden: Any) -> None:
    model, _ = lenet()
    returned = get_model_profile(model, input_shape=(1, 1, 32, 32), top_modules=3, clock=FakeClock())
    out = capsys.readouterr().out
    golden("deepspeed_lenet5.out", out)
    assert returned == ("852.37 K", "416.52 KMACs", "61.71 K")  # flops: 2 per MAC plus bias, tanh, pooling
    assert LENET_MACS == 416_520 and LENET_PARAMS == 61_706
    assert _value(out, "fwd MACs per GPU:") == "416.52 KMACs"
    # The printed MACs of the children add up to their parent's (the tree adds up).
    assert "(0): Conv2d(156 = 0.25% Params, 117.6 KMACs = 28.23% MACs" in out
    assert "(3): Conv2d(2.42 K = 3.92% Params, 240 KMACs = 57.62% MACs" in out
    assert "(features): Sequential(\n    2.57 K = 4.17% Params, 357.6 KMACs = 85.85% MACs" in out


def test_golden_backward_mode(capsys: pytest.CaptureFixture[str], golden: Any) -> None:
    model, _ = lenet()
    _, macs, params = get_model_profile(
        model, input_shape=(1, 1, 32, 32), mode="backward", as_string=False, clock=FakeClock()
    )
    out = capsys.readouterr().out
    golden("deepspeed_lenet5_backward.out", out)
    # Backward, measured: each conv and linear computes its weight's gradient (as many MACs
    # as forward) and, but for the first conv, its input's gradient (as many again).
    backward_macs = 2 * LENET_MACS - 28 * 28 * 25 * 6
    assert macs == LENET_MACS + backward_macs
    assert _value(out, "bwd MACs per GPU (measured):") == "715.44 KMACs"
    assert "bwd latency:" in out and "iter latency:" in out
    assert params == LENET_PARAMS


def test_golden_flops_profiler_window_with_backward_and_step(
    capsys: pytest.CaptureFixture[str], golden: Any
) -> None:
    model, x = lenet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    prof = FlopsProfiler(model, clock=FakeClock())
    prof.start_profile(ignore_list=[nn.Tanh])
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    prof.print_model_profile(profile_step=7, top_modules=2, module_depth=1)
    golden("deepspeed_lenet5_window.out", capsys.readouterr().out)
    prof.print_model_aggregated_profile(module_depth=2, top_modules=2)
    aggregated = capsys.readouterr().out
    golden("deepspeed_lenet5_aggregated.out", aggregated)
    assert aggregated.startswith("Top 2 modules") and "depth 2:" in aggregated
    assert "Tanh" not in aggregated  # ignored
    check_tree(prof.profile)
    prof.end_profile()
    with pytest.raises(ProfilerStateError, match="end_profile"):
        prof.get_total_flops()


# -- call styles ----------------------------------------------------------------------


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.fc(y)


def test_args_kwargs_and_input_constructor() -> None:
    model = Pair()
    x = torch.ones(2, 4)
    expected = 2 * 2 * 4 * 3  # two calls of fc on 2 rows
    assert get_model_profile(model, args=[x, x], print_profile=False, as_string=False)[1] == expected
    assert get_model_profile(model, kwargs={"x": x, "y": x}, print_profile=False, as_string=False)[1] == expected
    # Both positional and keyword: measured in a Profiler block.
    assert get_model_profile(model, args=[x], kwargs={"y": x}, print_profile=False, as_string=False)[1] == expected
    # The old API: input_constructor's dict is the keyword arguments; (macs, params) back.
    assert get_model_profile(
        model, (2, 4), input_constructor=lambda shape: {"x": torch.ones(shape), "y": torch.ones(shape)},
        print_profile=False, as_strings=False,
    ) == (expected, 15)


def test_output_file_and_engine_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Engine:
        world_size, dp_world_size, mp_world_size = 4, 2, 2

        def train_micro_batch_size_per_gpu(self) -> int:
            return 8

    model, x = lenet()
    target = tmp_path / "new" / "profile.txt"
    get_model_profile(model, input_shape=(1, 1, 32, 32), output_file=str(target), detailed=False, clock=FakeClock())
    assert capsys.readouterr().out == ""
    assert "fwd MACs per GPU:" in target.read_text(encoding="utf-8")
    prof = FlopsProfiler(model, ds_engine=Engine(), clock=FakeClock())
    prof.start_profile()
    model(x)
    prof.print_model_profile(detailed=False)
    out = capsys.readouterr().out
    assert _value(out, "model parallel size:") == "2"
    assert _value(out, "batch size per GPU:") == "8"
    assert _value(out, "params of model = params per GPU * mp_size:") == "123.41 K"
    prof.end_profile()


def test_bad_calls() -> None:
    model = Pair()
    with pytest.raises(TypeError, match="'inputs_res'"):
        get_model_profile(model, inputs_res=(4,))
    with pytest.raises(ValueError, match="mode"):
        get_model_profile(model, input_shape=(1, 4), mode="sideways")
    with pytest.raises(ValueError, match="input_shape"):
        get_model_profile(model)
    prof = FlopsProfiler(model)
    with pytest.raises(ProfilerStateError, match="start_profile"):
        prof.get_total_macs()
    prof.print_model_profile()  # not started: prints nothing, as DeepSpeed


def test_every_call_after_end_profile(capsys: pytest.CaptureFixture[str]) -> None:
    # As DeepSpeed's: the print methods print nothing once the profile has ended. Its
    # getters fail on the module attributes end_profile() deleted; here they say why.
    model, x = lenet()
    prof = FlopsProfiler(model, clock=FakeClock())
    prof.start_profile()
    model(x)
    assert prof.get_total_macs() == LENET_MACS
    prof.end_profile()
    dropped = r"^the figures were dropped by end_profile\(\): read them before end_profile\(\), or call start_profile\(\) and run the model again$"
    for getter in (prof.get_total_duration, prof.get_total_flops, prof.get_total_macs, prof.get_total_params):
        for as_string in (False, True):
            with pytest.raises(ProfilerStateError, match=dropped):
                getter(as_string=as_string)
    with pytest.raises(ProfilerStateError, match=dropped):
        _ = prof.profile
    prof.print_model_profile()
    prof.print_model_aggregated_profile()
    assert capsys.readouterr().out == ""
    prof.end_profile()  # a second end is a no-op, as in DeepSpeed
    prof.start_profile()  # and a new window measures again
    model(x)
    assert (prof.get_total_macs(), prof.get_total_params()) == (LENET_MACS, LENET_PARAMS)
    assert prof.get_total_flops() == LENET_FLOPS
    prof.end_profile()


# -- no side effects -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("print_profile", [True, False])
def test_get_model_profile_leaves_no_trace(mode: str, print_profile: bool, capsys: pytest.CaptureFixture[str]) -> None:
    model = everything("mixed")
    before = snapshot(model)
    get_model_profile(model, input_shape=(4, 4), mode=mode, print_profile=print_profile, clock=FakeClock())
    assert_unchanged(before, snapshot(model))


def test_flops_profiler_leaves_no_trace() -> None:
    model = everything("train")
    # The window wraps the user's own training step: its BatchNorm updates and dropout
    # draws are the user's, so values are not compared (as for a Profiler block).
    before = snapshot(model, values=False)
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(X4).sum().backward()
    assert prof.get_total_params() == sum(p.numel() for p in model.parameters())
    prof.end_profile()
    for p in model.parameters():
        p.grad = None  # the training step's own gradients, not the profiler's doing
    assert_unchanged(before, snapshot(model, values=False))


def test_raising_forward_leaves_no_trace() -> None:
    boom = ValueError("boom")
    model = Failing(boom)
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"^boom(\n|$)"):
        get_model_profile(model, input_shape=(4, 4), warm_up=0)
    assert_unchanged(before, snapshot(model))
    model.raiser.calls[0] = 0
    prof = FlopsProfiler(model)
    prof.start_profile()
    with pytest.raises(ValueError, match=r"^boom(\n|$)"):
        model(X4)
    prof.end_profile()
    assert_unchanged(before, snapshot(model))
