"""A block that records its first step in detail and times the others lightly
(``Profiler(detail="first")``): each figure comes from the steps that measured it.

First from hand-written event streams (every number computed by hand, and the text
checked against a golden file), then on real models, against a block that details
every step of the same work.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import layerscope
from layerscope.attribute import parent_indices
from layerscope.attribute.cycle import Cycle
from layerscope.capture.replay import WindowRecorder
from layerscope.model.check import check_tree, tree_problems
from layerscope.model.raw import Enter, Event, Exit, ModuleInfo, Op, RawCapture, Step
from layerscope.model.runfacts import RunFacts
from layerscope.model.tree import Profile

# root -> a -> a.b
MODULES = [
    ModuleInfo(path="", type="Root", parent=None, depth=0, params=0),
    ModuleInfo(path="a", type="A", parent="", depth=1, params=10),
    ModuleInfo(path="a.b", type="B", parent="a", depth=2, params=5),
]
ROOT, A, B = range(3)


def _step(t: int, b_ns: int, a_ns: int, root_ns: int, *, detailed: bool) -> list[Event]:
    """One step at ``t``: root runs ``root_ns`` of its own, a ``a_ns``, b one op of ``b_ns``
    (with shapes and FLOPs only when ``detailed``)."""
    op = Op(
        t + 2, t + 2 + b_ns, "aten::mm",
        input_shapes=[[2, 3], [3, 4]] if detailed else None,
        flops=48 if detailed else None, macs=24 if detailed else None,
    )
    t_b = t + 1
    t_a_end = t_b + b_ns + 2 + a_ns
    t_end = t_a_end + root_ns
    return [
        Step(t), Enter(t, ROOT), Enter(t, A), Enter(t_b, B), op, Exit(t_b + b_ns + 2, B),
        Exit(t_a_end, A), Exit(t_end, ROOT), Step(t_end),
    ]


def _cycle_profile() -> Profile:
    cycle = Cycle(copy.deepcopy(MODULES), parent_indices(MODULES), collect_ops=True)
    # The detailed step is slow (recording shapes): none of its times may show.
    cycle.add(_step(0, 5000, 900, 900, detailed=True), 0, warmup=False, keep_empty=False, has_device=False)
    cycle.add(_step(10_000, 100, 40, 10, detailed=False), 1, warmup=False, keep_empty=False, has_device=False, light=True)
    cycle.add(_step(20_000, 200, 60, 30, detailed=False), 2, warmup=False, keep_empty=False, has_device=False, light=True)
    raw = RawCapture(modules=copy.deepcopy(MODULES), meta=RunFacts(model="Root", device="cpu", mode="context"))
    return check_tree(cycle.build(raw))


def test_times_are_the_light_steps_means_and_counts_the_detailed_steps() -> None:
    prof = _cycle_profile()
    # b: its op ran 100 and 200 ns, plus 2 ns of its own each time: mean 152 (the
    # detailed step's 5,002 ns is not in it).
    b, a, root = prof["a.b"].forward, prof["a"].forward, prof[""].forward
    assert (b.self_cpu_time_ns, b.cpu_time_ns) == (152, 152)
    assert (a.self_cpu_time_ns, a.cpu_time_ns) == (51, 152 + 51)  # 1 + 40, 1 + 60: mean 51
    assert (root.self_cpu_time_ns, root.cpu_time_ns) == (20, 152 + 51 + 20)
    # Counts are the detailed step's, once (never scaled to the two light steps).
    assert (b.flops, b.macs, a.flops, root.flops) == (48, 24, 48, 48)
    assert prof["a.b"].calls == 1
    (row,) = prof["a.b"].ops
    assert (row.name, row.calls, row.input_shapes, row.flops) == ("aten::mm", 1, [[2, 3], [3, 4]], 48)
    assert (row.cpu_time_ns, row.self_cpu_time_ns) == (None, None)  # the detailed step's times are not used
    figures = prof.figures
    assert (figures.steps, figures.step_numbers, figures.detailed_steps) == (2, [1, 2], [0])
    assert figures.step_times_ns == [153, 293]  # the light steps' walls (the step spread's)
    assert prof.step_time_ns == 152 + 51 + 20  # the mean step: its nodes' means, nothing outside the model
    assert prof.trace is None


def test_a_cycle_with_every_step_detailed_sums_them_as_before() -> None:
    cycle = Cycle(copy.deepcopy(MODULES), parent_indices(MODULES), collect_ops=True)
    for number, t in enumerate((0, 10_000)):
        cycle.add(_step(t, 100, 40, 10, detailed=True), number, warmup=False, keep_empty=False, has_device=False)
    prof = check_tree(cycle.build(RawCapture(modules=copy.deepcopy(MODULES))))
    assert prof.figures.detailed_steps is None
    assert prof["a.b"].forward.flops == 96 and prof["a.b"].ops[0].cpu_time_ns == 200


def test_the_text_says_which_steps_gave_which_figures(golden: Any) -> None:
    text = _cycle_profile().render("text", width=120)
    golden("light_steps_block.out", text)
    assert "times: mean of 2 light steps" in text
    assert "rows from step 0, recorded in detail" in text


def test_the_document_keeps_the_detailed_steps() -> None:
    prof = _cycle_profile()
    again = Profile.from_dict(prof.to_dict())
    assert again.figures.detailed_steps == [0]
    assert again.figures == prof.figures


def test_a_diff_of_profiles_without_op_times_compares_their_counts() -> None:
    base, new = _cycle_profile(), _cycle_profile()
    text = layerscope.diff(base, new).render()
    assert "FLOPs" in text


# -- on real models ----------------------------------------------------------------------


def _bert() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128, vocab_size=500,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    return BertModel(config), {"input_ids": ids}


def _train(model: nn.Module, inputs: dict[str, torch.Tensor], steps: int, **options: Any) -> tuple[Any, WindowRecorder]:
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    with WindowRecorder() as windows, layerscope.Profiler(model, **options) as prof:
        for _ in range(steps):
            model(**inputs).last_hidden_state.sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return prof, windows


def test_a_training_block_details_its_first_step_and_times_the_rest_lightly() -> None:
    model, inputs = _bert()
    twin = copy.deepcopy(model)
    prof, windows = _train(model, inputs, 4, detail="first")
    # Step 0 recorded with shapes and memory; steps 1-3 in a window of their own without.
    assert [w["detail"] for w in windows.windows] == [True, False]
    profile = prof.profile
    assert tree_problems(profile) == []
    figures = profile.figures
    assert (figures.detailed_steps, figures.step_numbers, figures.steps) == ([0], [1, 2, 3], 3)
    # Every count is the detailed step's: the same as a block that details its one step.
    one, _ = _train(twin, inputs, 1)
    reference = one.profile
    for node in profile.modules():
        other = reference[node.path]
        assert node.calls == other.calls, node.path
        for (phase, stats), (_, expected) in zip(node.phases(), other.phases()):
            assert (stats.flops, stats.macs) == (expected.flops, expected.macs), (node.path, phase)
            assert (stats.alloc_bytes, stats.activation_bytes) == (expected.alloc_bytes, expected.activation_bytes), (
                node.path, phase,
            )
        assert [(op.name, op.input_shapes, op.flops) for op in node.ops] == [
            (op.name, op.input_shapes, op.flops) for op in other.ops
        ], node.path
        assert all(op.cpu_time_ns is None for op in node.ops)
    assert profile.memory is not None and reference.memory is not None
    assert profile.memory.peak_bytes == reference.memory.peak_bytes
    # The times are the light steps': every module that ran has a time of its own.
    assert {"encoder.layer.0.attention", "encoder.layer.1.output.dense"} <= {
        node.path for node in profile.modules() if node.forward.self_cpu_time_ns > 0
    }
    assert {part.path for part in profile.parts} >= {"<optimizer:AdamW>", "<other>"}
    assert not any(part.kind == "overhead" for part in profile.parts)  # layerscope's notes ran in step 0 only


def test_each_cycle_of_a_schedule_details_its_first_active_step() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    cycles: list[Profile] = []
    schedule = layerscope.schedule(wait=1, warmup=1, active=3, repeat=2)
    with WindowRecorder() as windows, layerscope.Profiler(
        model, detail="first", schedule=schedule, on_ready=cycles.append,
    ) as prof:
        for _ in range(10):
            model(x)
            prof.step()
    assert [c.figures.detailed_steps for c in cycles] == [[2], [7]]
    assert [c.figures.step_numbers for c in cycles] == [[3, 4], [8, 9]]
    # The warm-up step is timed lightly (and dropped), then the active steps' windows.
    assert [w["detail"] for w in windows.windows] == [False, True, False] * 2
    for cycle in cycles:
        assert tree_problems(cycle) == []
        assert cycle["0"].forward.flops == 2 * 4 * 8 * 8 + 4 * 8  # addmm: the product, then the bias


def test_a_one_step_block_details_its_step_as_usual() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with layerscope.Profiler(model, detail="first") as prof:
        model(torch.randn(2, 8))
    assert prof.profile.figures.detailed_steps is None
    assert prof.profile["0"].ops[0].cpu_time_ns is not None


def test_the_model_is_left_as_it_was() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    before = (dict(model.__dict__), model.training)
    with layerscope.Profiler(model, detail="first") as prof:
        for _ in range(3):
            model(torch.randn(2, 8))
            prof.step()
    assert (dict(model.__dict__), model.training) == before
    assert not torch.nn.modules.module._global_forward_hooks and not torch.nn.modules.module._global_forward_pre_hooks


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"detail": "some"}, "detail must be one of 'every', 'first', got 'some'"),
        ({"detail": "first", "record_ops": False}, "detail='first' with record_ops=False"),
    ],
)
def test_bad_detail_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        layerscope.Profiler(nn.Linear(2, 2), **options)


def test_means_add_up_as_their_sums_did() -> None:
    from layerscope.attribute.profile import _mean, _mean_busy
    from layerscope.model.raw import DeviceBusy

    # 10/3, 10/3, 11/3: floors 3, 3, 3 leave one ns of the mean of the sum (31 // 3 = 10),
    # which goes to the largest remainder (11 % 3 = 2).
    assert _mean({"a": 10, "b": 10, "c": 11}, 3) == {"a": 3, "b": 3, "c": 4}
    # Equal remainders: the first keeps the ns.
    assert _mean({"a": 1, "b": 1}, 2) == {"a": 1, "b": 0}
    # busy = compute + comm - overlap holds for the means too, and no rest is negative.
    busy = _mean_busy(DeviceBusy(busy_ns=29, compute_ns=20, comm_ns=14, overlap_ns=5, unlinked_ns=2), 3)
    assert busy == DeviceBusy(busy_ns=6 + 4 - 1, compute_ns=6, comm_ns=4, overlap_ns=1, unlinked_ns=0)


def test_sorting_ops_by_time_says_why_they_have_none() -> None:
    from layerscope.model.ops import OpTableError

    with pytest.raises(OpTableError, match=r"they are the block's detailed step's.*Profiler\(detail='every'\)"):
        _cycle_profile().ops(sort_by="self_cpu_time")
    assert _cycle_profile().ops().rows[0].name == "aten::mm"  # sorted by what it has (FLOPs)


def test_key_averages_says_its_times_were_not_measured() -> None:
    from layerscope.compat.torch_profiler import key_averages

    table = key_averages(_cycle_profile()).table(sort_by="cpu_time_total", row_limit=5)
    assert "aten::mm" in table
    assert "their times are not measured (?); Profiler(detail='every') times every op" in table
    # An unknown time reads ?, never 0 (nor a share of 0).
    row = next(line for line in table.splitlines() if "aten::mm" in line)
    assert "0.000us" not in row and "NaN" not in row and row.split()[1:6] == ["?"] * 5
    assert "Self CPU time total: ?" in table


def test_inside_a_users_torch_profiler_every_step_is_recorded_as_before() -> None:
    # Only one torch profiler runs: the block falls back to the dispatch mode for every
    # step (its times say so), and has no light windows to switch to.
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with torch.profiler.profile(), layerscope.Profiler(model, detail="first") as prof:
        for _ in range(3):
            model(torch.randn(2, 8))
            prof.step()
    profile = prof.profile
    assert profile.meta.times_from == "dispatch mode"
    assert (profile.figures.detailed_steps, profile.figures.steps) == (None, 3)
    assert profile["0"].forward.flops == 3 * (2 * 2 * 8 * 8 + 2 * 8)


# -- hooks="first": light steps without module hooks, their ops aligned ------------------


def test_light_steps_without_module_hooks_get_the_modules_of_the_hooked_step() -> None:
    """``hooks="first"``: the detailed step runs the module hooks; the light steps run
    torch's profiler alone (no global module hook is installed while they run), and
    their ops are placed in the calls of the detailed step's template. The tree is the
    one a hooked block builds: the same calls and counts, every module with ops timed."""
    model, inputs = _bert()
    twin = copy.deepcopy(model)
    hooks_seen: list[int] = []
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    with layerscope.Profiler(model, detail="first", hooks="first") as prof:
        for _ in range(4):
            hooks_seen.append(len(torch.nn.modules.module._global_forward_pre_hooks))
            model(**inputs).last_hidden_state.sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    # Step 0's window runs layerscope's hooks; steps 1-3 run none.
    assert hooks_seen[0] >= 1 and hooks_seen[1:] == [0, 0, 0]
    profile = prof.profile
    assert tree_problems(profile) == []
    placed = profile.meta.modules_from.placement
    assert placed is not None
    assert placed.passes == 3 and placed.unaligned == ()
    # One call of the model per light step, every forward op found: the same library ran
    # the template and the steps, so nothing is placed by neighbours.
    assert placed.aligned == 3 * placed.template_ops and placed.by_neighbours == 0
    hooked, _ = _train(twin, inputs, 4, detail="first")
    reference = hooked.profile
    assert [n.path for n in profile.modules()] == [n.path for n in reference.modules()]
    for node in profile.modules():
        other = reference[node.path]
        assert node.calls == other.calls, node.path
        assert node.forward.flops == other.forward.flops, node.path
        if other.forward.self_cpu_time_ns and node.ops:
            assert node.forward.self_cpu_time_ns > 0, node.path
        if other.backward is not None and other.backward.cpu_time_ns:
            assert node.backward is not None and node.backward.cpu_time_ns > 0, node.path
    text = profile.render("text", depth=0)
    assert (
        f"Light steps without module hooks (hooks='first'): {placed.ops} forward ops of 3 model calls aligned to "
        f"the hooked step's {placed.template_ops}: {placed.aligned} aligned, 0 placed by neighbours, "
        f"{placed.unplaced} in no module; module CPU times run from a call's first op to its last"
    ) in text



def test_a_light_step_that_does_not_align_is_named_and_the_next_window_is_hooked_again(tmp_path: Any) -> None:
    """The model takes another branch in step 2 (an early exit: its later blocks never
    run): that step's ops match too few of the template's calls, stay with the step,
    and are named; the window after it (a window holds ``WINDOW_STEPS`` steps) runs the
    hooks again."""
    from layerscope.block import WINDOW_STEPS


    class EarlyExit(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(4)])
            self.exit_after: int | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for k, block in enumerate(self.blocks):
                x = block(x)
                if self.exit_after == k:
                    break
            return x

    model = EarlyExit()
    x = torch.randn(2, 8)
    hooks_seen: list[int] = []
    steps = 2 * WINDOW_STEPS + 2
    with layerscope.Profiler(model, detail="first", hooks="first") as prof:
        for step in range(steps):
            model.exit_after = 0 if step == 2 else None
            hooks_seen.append(len(torch.nn.modules.module._global_forward_pre_hooks))
            model(x)
            prof.step()
    profile = prof.profile
    placed = profile.meta.modules_from.placement
    assert placed is not None
    # Step 2 ran the first block alone: 3 of the template's 12 ops (4 blocks of 3).
    assert placed.unaligned == ("step 2, pass 1: 25% of the template matched",)
    assert tree_problems(profile) == []
    # Step 0 hooked (detailed); the first light window unhooked; the next one hooked
    # again (its template learned anew); the one after unhooked.
    first_light, second_light = 1, 1 + WINDOW_STEPS
    assert hooks_seen[0] >= 1
    assert set(hooks_seen[first_light:second_light]) == {0}
    assert set(hooks_seen[second_light : second_light + WINDOW_STEPS]) != {0}
    assert "Not aligned (their ops left with the step): step " in profile.render("text", depth=0)
    # Saved and read back, the placement stays.
    profile.save(tmp_path / "run.json")
    assert layerscope.load(tmp_path / "run.json").meta.modules_from.placement == placed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hooks": "some"}, "hooks must be one of 'every', 'first', got 'some'"),
        ({"hooks": "first"}, "hooks='first' records the light steps of detail='first'"),
    ],
)
def test_bad_hooks_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        layerscope.Profiler(nn.Linear(2, 2), **options)


def test_hooks_first_aligns_the_light_steps_and_the_default_keeps_the_hooks() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 8)
    seen: dict[str | None, list[int]] = {}
    profiles = {}
    for hooks in ("first", None):
        options = {} if hooks is None else {"hooks": hooks}
        counts = seen.setdefault(hooks, [])
        with layerscope.Profiler(model, detail="first", **options) as prof:
            for _ in range(3):
                counts.append(len(torch.nn.modules.module._global_forward_pre_hooks))
                model(x)
                prof.step()
        profiles[hooks] = prof.profile
    assert seen["first"][1:] == [0, 0] and min(seen[None]) >= 1
    placed = profiles["first"].meta.modules_from.placement
    assert placed is not None and (placed.passes, placed.aligned, placed.template_ops) == (2, 6, 3)
    assert profiles[None].meta.modules_from is None
    for path in ("", "0", "1", "2"):
        assert profiles["first"][path].calls == profiles[None][path].calls == 1


def test_a_step_that_calls_two_parts_of_the_model_aligns_both() -> None:
    """A step that calls the model's encoder, then its decoder (not the model itself):
    the template is both calls, and each light step's ops find the part they ran in."""

    class EncoderDecoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
            self.decoder = nn.Sequential(nn.Linear(8, 4), nn.Tanh())

    model = EncoderDecoder()
    x = torch.randn(2, 8)
    with layerscope.Profiler(model, detail="first", hooks="first") as prof:
        for _ in range(3):
            model.decoder(model.encoder(x))
            prof.step()
    profile = prof.profile
    placed = profile.meta.modules_from.placement
    assert placed is not None and placed.unaligned == () and placed.aligned == 2 * placed.template_ops
    assert tree_problems(profile) == []
    assert profile["encoder.0"].calls == profile["decoder.0"].calls == 1
    assert profile["encoder.0"].forward.self_cpu_time_ns > 0 and profile["decoder.1"].forward.self_cpu_time_ns > 0
