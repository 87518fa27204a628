"""Device time shared out (``convert/device.py``) on small synthetic kernel streams whose
figures are worked out by hand in the comments: the cases the mutation run
(benchmarks/mutation.py) found untested: correlation id 1, kernels wholly inside
earlier ones, several unlinked kernels in a step, and several collectives in one step."""

from __future__ import annotations

from layerscope.convert.device import kernel_steps, share_device_time
from layerscope.convert.ranges import KernelSpan
from layerscope.model.raw import DeviceBusy

ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def test_correlation_id_1_is_a_link_like_any_other() -> None:
    # Launched at 50 (step 0), it ran at 2500, inside step 1's window: it is step 0's.
    assert kernel_steps([KernelSpan(1, 2500, 2600)], [(0, 100), (2000, 3000)], {1: 50}) == [0]


def test_compute_inside_earlier_compute_is_counted_once() -> None:
    kernels = [
        KernelSpan(1, 0, 100),  # op 1 holds [0, 100)
        KernelSpan(2, 10, 20),  # wholly inside op 1's kernel: nothing of its own
        KernelSpan(3, 30, 50),  # also inside [0, 100): nothing, though it starts after 20
        KernelSpan(4, 40, 100),  # ends where op 1's ends: nothing, not an empty piece
        KernelSpan(0, 150, 160),  # launched from no op: 10 unlinked
        KernelSpan(0, 170, 200),  # and 30 more
    ]
    busy, pieces = share_device_time(kernels, [(0, 1000)], {1: 0, 2: 0, 3: 0, 4: 0})
    # compute: [0, 100) + [150, 160) + [170, 200) = 140, of it 40 unlinked; no collective
    assert busy == {0: DeviceBusy(140, 140, 0, 0, 40)}
    assert pieces == {1: [(0, 100)]}


def test_several_collectives_in_a_step_are_their_union_less_compute() -> None:
    kernels = [
        KernelSpan(7, 0, 100),  # compute, op 7
        KernelSpan(0, 50, 150, ALL_REDUCE),
        KernelSpan(0, 60, 80, ALL_REDUCE),  # inside the one before
        KernelSpan(0, 120, 200, ALL_REDUCE),  # overlaps the first one's tail
        KernelSpan(0, 300, 310, ALL_REDUCE),  # alone
    ]
    busy, pieces = share_device_time(kernels, [(0, 1000)], {7: 0})
    # comm: [50, 200) and [300, 310) = 160; alone (not under compute [0, 100)): [100, 200)
    # and [300, 310) = 110; overlap 160 - 110 = 50; busy: compute 100 + alone 110 = 210,
    # the union [0, 200) + [300, 310).
    assert busy == {0: DeviceBusy(210, 100, 160, 50, 0)}
    assert pieces == {7: [(0, 100)]}


def test_collectives_of_two_steps_are_each_their_steps() -> None:
    kernels = [
        KernelSpan(0, 10, 30, ALL_REDUCE),
        KernelSpan(0, 20, 40, ALL_REDUCE),  # overlaps the one before: 10 more
        KernelSpan(0, 2010, 2020, ALL_REDUCE),
        KernelSpan(0, 2030, 2045, ALL_REDUCE),
    ]
    busy, pieces = share_device_time(kernels, [(0, 1000), (2000, 3000)], {})
    assert busy == {0: DeviceBusy(30, 0, 30, 0, 0), 2000: DeviceBusy(25, 0, 25, 0, 0)}
    assert pieces == {}
