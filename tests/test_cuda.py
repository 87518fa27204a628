"""CUDA paths: device time per module and op. Skipped where torch sees no CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import layerscope
from layerscope import zoo

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_profile_on_cuda_has_device_times() -> None:
    entry = zoo.get("resnet18")
    model = entry.build().eval().cuda()
    prof = layerscope.profile(model, entry.example_inputs(2).cuda(), warmup=2, repeat=3)
    layerscope.check_tree(prof)
    root = prof.root
    assert prof.meta.device.startswith("cuda")
    assert root.forward.device_time_ns is not None and root.forward.device_time_ns > 0
    # Convolutions run on the device: their modules show device time, and their ops do.
    conv = prof["conv1"]
    assert conv.forward.device_time_ns > 0
    assert any(op.device_time_ns and op.device_time_ns > 0 for op in conv.ops)
    text = prof.render("text")
    assert "Self Device" in text and "Device total" in text


def test_profiler_block_on_cuda() -> None:
    entry = zoo.get("gpt")
    model = entry.build().eval().cuda()
    x = entry.example_inputs(2).cuda()
    with torch.no_grad(), layerscope.Profiler(model) as prof:
        model(x)
    layerscope.check_tree(prof.profile)
    assert prof.root.forward.device_time_ns > 0
    assert prof["blocks.0.attn"].forward.device_time_ns > 0


def _chain_on_cuda() -> torch.nn.Sequential:
    # Every tensor is a multiple of 512 bytes, the caching allocator's rounding, so its
    # figures and layerscope's logical bytes can be compared exactly.
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.ReLU()
    ).cuda()


def test_a_light_step_block_on_cuda_times_every_module_on_the_device() -> None:
    entry = zoo.get("gpt")
    model = entry.build().cuda()
    x = entry.example_inputs(2).cuda()
    opt = torch.optim.AdamW(model.parameters())
    with layerscope.Profiler(model, detail="first") as prof:
        for _ in range(4):
            model(x).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    profile = layerscope.check_tree(prof.profile)
    assert profile.figures.detailed_steps == [0] and profile.figures.step_numbers == [1, 2, 3]
    ledger = profile.device
    assert ledger is not None and ledger.busy_ns > 0
    # Every module with kernels in the detailed step has device time of its own in the
    # light steps' means, forward and backward.
    for node in profile.modules():
        for phase, stats in node.phases():
            if stats.self_flops:
                assert stats.self_device_time_ns, (node.path, phase)


def test_module_memory_agrees_with_memory_allocated_deltas() -> None:
    model = _chain_on_cuda()
    x = torch.randn(8, 64, device="cuda")
    model(x).sum().backward()  # cuBLAS workspaces exist before anything is measured
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    # Reference: memory_allocated() before and after each module's forward, from hooks
    # registered (and removed) by this test.
    deltas: dict[str, int] = {}
    before: dict[str, int] = {}
    names = {m: n for n, m in model.named_modules()}
    handles = [
        m.register_forward_pre_hook(lambda mod, args: before.__setitem__(names[mod], torch.cuda.memory_allocated()))
        for m in model
    ] + [
        m.register_forward_hook(
            lambda mod, args, out: deltas.__setitem__(names[mod], torch.cuda.memory_allocated() - before[names[mod]])
        )
        for m in model
    ]
    out = model(x)
    for handle in handles:
        handle.remove()
    del out
    prof = layerscope.check_tree(layerscope.profile(model, x, no_grad=False, warmup=1, repeat=1))
    for path, delta in deltas.items():
        stats = prof[path].forward
        assert stats.alloc_bytes - stats.freed_bytes == delta, path


def test_step_peak_agrees_with_max_memory_allocated() -> None:
    model = _chain_on_cuda()
    x = torch.randn(8, 64, device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    step()
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with layerscope.Profiler(model) as prof:
        step()
    torch.cuda.synchronize()
    memory = layerscope.check_tree(prof.profile).memory
    allocator_peak = torch.cuda.max_memory_allocated()
    # The allocator, sampled after each op, never exceeds its own high-water mark...
    assert memory.device.allocated_peak_bytes <= allocator_peak
    assert memory.device.reserved_at_peak_bytes >= memory.device.allocated_peak_bytes
    # ...and the logical growth above the step's start is the allocator's growth.
    assert memory.peak_bytes - memory.baseline_bytes == allocator_peak - start


def test_timed_steps_take_device_time_from_kernels_and_match_torch_profiler() -> None:
    # Every step is recorded by torch's profiler: each node's device time is the union of
    # its ops' kernels. All nodes' self device time (the model's, and the loss ops' in the
    # step's parts) must agree with the kernels torch.profiler itself records for the
    # same steps (within 5%: the same kernels, measured on other runs; one stream, so the
    # union is the sum).
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)
    ).cuda()
    x = torch.randn(256, 512, device="cuda")
    steps = 5

    def step() -> None:
        model(x).pow(2).mean().backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    with layerscope.Profiler(model) as prof:
        for _ in range(steps):
            step()
            prof.step()
    profile = layerscope.check_tree(prof.profile)
    assert profile.figures.steps == steps and "counts_from" not in profile.meta.to_dict()
    ours = sum(stats.self_device_time_ns or 0 for node in profile.nodes() for _, stats in node.phases())
    # The model's own kernels are most of it (the loss, pow and mean, is a few small ones).
    in_model = profile.root.forward.device_time_ns + profile.root.backward.device_time_ns
    assert 0.5 * ours < in_model <= ours
    for path in ("0", "2"):
        assert profile[path].forward.self_device_time_ns > 0
        assert profile[path].backward.self_device_time_ns > 0
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as theirs:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    cpu = torch._C._autograd.DeviceType.CPU
    kernels = sum(
        e.end_ns() - e.start_ns() for e in theirs.profiler.kineto_results.events() if e.device_type() != cpu
    )
    assert kernels > 0
    assert abs(ours - kernels) / kernels < 0.05, (ours, kernels)


def test_a_released_input_is_freed_while_the_profiler_runs_on_cuda() -> None:
    # Recording shapes must not keep an op's inputs alive until the profiler stops
    # (an OOM risk on a GPU): x and y, 4 MiB each, are freed when deleted, so the
    # allocator's own figure never holds them beside the next two.
    model = torch.nn.Linear(8, 8).cuda()
    mib4 = 1024 * 1024 * 4
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    with layerscope.Profiler(model) as prof:
        model(torch.randn(4, 8, device="cuda"))
        x = torch.randn(1024, 1024, device="cuda")
        y = x * 2
        del x, y
        big, again = torch.empty(1024, 1024, device="cuda"), torch.empty(1024, 1024, device="cuda")
        assert torch.cuda.memory_allocated() - base < 3 * mib4
        del big, again
        prof.step()
    profile = layerscope.check_tree(prof.profile)
    freed = sum(stats.freed_bytes or 0 for node in profile.nodes() for _, stats in node.phases())
    assert freed >= 4 * mib4


def test_memory_from_events_equals_the_dispatch_modes_on_cuda() -> None:
    # The same training step with memory from torch's allocation events, and inside a
    # user's torch.profiler (layerscope then records under its dispatch mode): module
    # figures agree (the caching allocator's events carry block sizes; these tensors'
    # sizes are multiples of 512 bytes, so the two agree exactly).
    import contextlib

    def run(inside: bool) -> layerscope.Profile:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).cuda()
        x = torch.randn(64, 128, device="cuda")
        with contextlib.ExitStack() as stack:
            if inside:
                stack.enter_context(torch.profiler.profile())
            prof = stack.enter_context(layerscope.Profiler(model))
            for _ in range(2):
                model(x).pow(2).mean().backward()
                model.zero_grad(set_to_none=True)
                prof.step()
        return layerscope.check_tree(prof.profile)

    events, dispatch = run(False), run(True)
    for node in events.modules():
        for phase in ("forward", "backward"):
            mine, theirs = getattr(node, phase), getattr(dispatch[node.path], phase)
            assert (mine.alloc_bytes, mine.activation_bytes, mine.flops) == (
                theirs.alloc_bytes, theirs.activation_bytes, theirs.flops
            ), (node.path, phase)


# -- CUDA paths the tests above do not reach ------------------------------------------------


def test_mfu_peak_is_the_datasheets_or_unknown_with_the_device_named() -> None:
    from layerscope.capture.modules import known_peak_flops_per_s

    model = _chain_on_cuda()
    prof = layerscope.profile(model, torch.randn(8, 64, device="cuda"), warmup=1, repeat=2)
    name = torch.cuda.get_device_name().lower()
    peak = known_peak_flops_per_s(torch.device("cuda"), "float32")
    assert prof.meta.peak_flops_per_s == peak
    with layerscope.Profiler(model) as block:  # a block knows the same peak
        model(torch.randn(8, 64, device="cuda"))
    assert block.profile.meta.peak_flops_per_s == peak
    if peak is None:
        # A GPU the table does not list: no MFU column, never a made-up one.
        assert "MFU" not in prof.render("text"), name
    else:
        assert "MFU" in prof.render("text")
    # Under autocast the matrix units run bfloat16: the peak is that dtype's.
    with torch.autocast("cuda", dtype=torch.bfloat16):
        amp = layerscope.profile(model, torch.randn(8, 64, device="cuda"), warmup=1, repeat=2)
    assert amp.meta.peak_flops_per_s == known_peak_flops_per_s(torch.device("cuda"), "bfloat16")
    # In a block, autocast entered inside each step (the usual training loop) counts too.
    with layerscope.Profiler(model) as block:
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(torch.randn(8, 64, device="cuda"))
            block.step()
    assert block.profile.meta.autocast == "bfloat16"
    assert block.profile.meta.peak_flops_per_s == known_peak_flops_per_s(torch.device("cuda"), "bfloat16")


def test_backward_and_checkpoint_recompute_on_autograd_device_thread() -> None:
    # On a GPU, backward runs on autograd's device thread; a checkpoint's recompute runs
    # there too (the case a trace recorded on an MI300X showed was dropped).
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
            self.head = torch.nn.Linear(64, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(checkpoint(self.block, x, use_reentrant=False))

    model = Net().cuda()
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    model(x).sum().backward()
    with layerscope.Profiler(model) as prof:
        for _ in range(2):
            model(x).sum().backward()
            prof.step()
    layerscope.check_tree(prof.profile)
    profile = prof.profile
    block = profile["block"]
    assert block.backward is not None and block.backward.device_time_ns > 0
    # Two steps, batch 32 (as tests/test_backward.py counts on the CPU):
    #   block.0  Linear 64->256: 32*64*256 = 524,288 MACs -> 1,048,576 + 8,192 bias = 1,056,768
    #   block.1  GELU on 32*256 elements                                        =     8,192
    #   block.2  Linear 256->64: 32*256*64 = 524,288 MACs -> 1,048,576 + 2,048 bias = 1,050,624
    # The non-reentrant checkpoint stops recomputing once every saved tensor is back:
    # block.2 saved only its input (block.1's output), so it is not run again.
    recomputed = {"block.0": 2 * 1_056_768, "block.1": 2 * 8_192, "block.2": 0}
    for path, flops in recomputed.items():
        assert profile[path].recompute.flops == flops, path
    assert block.forward.flops == 2 * (1_056_768 + 8_192 + 1_050_624)
    assert block.recompute.flops == sum(recomputed.values()) == 2_129_920
    assert block.recompute.device_time_ns > 0


def test_profile_under_a_users_torch_profiler_falls_back_to_the_dispatch_mode_with_device_time() -> None:
    from torch.profiler import ProfilerActivity, profile

    model = _chain_on_cuda()
    x = torch.randn(8, 64, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        with layerscope.Profiler(model) as prof:
            model(x)
    layerscope.check_tree(prof.profile)
    assert prof.profile.meta.times_from == "dispatch mode"
    assert prof.root.forward.device_time_ns > 0


def test_compiled_model_on_cuda_matches_triton_kernels_to_modules() -> None:
    pytest.importorskip("triton")
    entry = zoo.get("mlp")
    model = entry.build().cuda()
    prof = layerscope.profile(torch.compile(model), entry.example_inputs(8).cuda(), warmup=1, repeat=3)
    layerscope.check_tree(prof)
    assert prof.compiled is not None
    kernels = prof.compiled.kernels
    assert kernels and all(k.time_ns >= 0 for k in kernels)
    assert any(k.call.startswith("triton") for k in kernels), [k.call for k in kernels]
    matched = [k for k in kernels if k.modules]
    assert len(matched) == len(kernels)
    # Each kernel call's device time is the kernels it launched, and each Linear's is its kernels'.
    assert all(k.device_ns is not None and k.device_ns > 0 for k in kernels), [(k.call, k.device_ns) for k in kernels]
    for node in prof.modules():
        if node.type == "Linear":
            assert node.forward.self_device_time_ns > 0, node.path


def test_compiled_training_loop_in_a_block_on_cuda_has_device_time_per_module_and_part() -> None:
    pytest.importorskip("triton")
    entry = zoo.get("mlp")
    model = entry.build().cuda()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters())
    x = entry.example_inputs(8).cuda()
    with layerscope.Profiler(compiled) as prof:
        for _ in range(4):
            opt.zero_grad()
            compiled(x).pow(2).mean().backward()
            opt.step()
            prof.step()
    profile = layerscope.check_tree(prof.profile)
    info = profile.compiled
    assert info is not None and {k.phase for k in info.kernels} == {"forward", "backward"}
    assert all(k.device_ns is not None and k.device_ns > 0 for k in info.kernels), [(k.call, k.device_ns) for k in info.kernels]
    for node in profile.modules():
        if node.type == "Linear":
            assert node.forward.self_device_time_ns > 0 and node.backward.self_device_time_ns > 0, node.path
    parts = {part.path: part for part in profile.parts}
    assert parts["<optimizer:AdamW>"].forward.self_device_time_ns > 0  # AdamW's kernels
    assert "Device time" in profile.render("kernels")


def test_ddp_over_nccl_on_one_gpu_counts_collective_bytes(tmp_path: Path) -> None:
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(_chain_on_cuda())
        x = torch.randn(8, 64, device="cuda")
        with layerscope.Profiler(model) as prof:
            for _ in range(2):
                model(x).sum().backward()
                prof.step()
        profile = prof.profile
        layerscope.check_tree(profile)
        moved = sum(stats.comm_bytes or 0 for node in profile.nodes() for _, stats in node.phases())
        params = sum(p.numel() * 4 for p in model.parameters())
        assert moved >= params  # each step all-reduces every gradient at least once
    finally:
        dist.destroy_process_group()
