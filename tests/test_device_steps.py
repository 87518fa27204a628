"""Which step a piece of device work is in (``convert/device.kernel_steps``), at the
boundaries: a launch exactly at a step's end is in that step, one a nanosecond later is
in none (a gap after it); work launched from no op is in the step its start lies in."""

from __future__ import annotations

from layerscope.convert.device import kernel_steps
from layerscope.convert.ranges import KernelSpan

STEPS = [(0, 100), (200, 300)]
LAUNCHED = {1: 100, 2: 101, 3: 300, 4: 200, 5: 301, 6: -5}


def test_a_launch_at_a_steps_very_end_is_in_that_step_and_one_after_it_is_in_none() -> None:
    kernels = [
        KernelSpan(1, 150, 160),  # launched at 100, step 0's last instant: step 0, though it ran after it
        KernelSpan(2, 150, 160),  # launched at 101, in the gap: no step
        KernelSpan(3, 310, 320),  # launched at 300, the last step's last instant: step 1
        KernelSpan(4, 200, 250),  # launched at 200, step 1's first instant
        KernelSpan(5, 310, 320),  # launched at 301, after every step: none
        KernelSpan(6, 10, 20),  # launched before the first step: none
    ]
    assert kernel_steps(kernels, STEPS, LAUNCHED) == [0, None, 1, 1, None, None]


def test_work_launched_from_no_op_is_in_the_step_its_start_lies_in() -> None:
    kernels = [
        KernelSpan(0, 300, 310),  # starts at the last step's end: in it
        KernelSpan(0, 301, 310),  # starts after every step: none
        KernelSpan(0, 150, 160),  # starts in the gap: the step before the gap
        KernelSpan(0, -1, 5),  # starts before the first step: none
    ]
    assert kernel_steps(kernels, STEPS, {}) == [1, None, 0, None]
