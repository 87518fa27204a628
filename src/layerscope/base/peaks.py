"""Peak dense FLOP/s of common accelerators, for MFU (% of peak) when the user gives none.
The live device's peak is read in ``capture/modules.py`` (``peak_flops_per_s``).

Vendor datasheet figures for dense math (no structured sparsity), per dtype. A device or
dtype not listed gets no automatic peak; ``--peak-tflops`` always overrides.
"""

from __future__ import annotations

# name fragment (lower case, matched in order) -> {dtype: dense TFLOP/s}. float32 is the
# vector (non-tensor-core) figure. The B200's is the HGX (1,000 W) board's; "MI300X"
# also matches its virtual function ("AMD Instinct MI300X VF"), the same chip.
_PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("b200", {"bfloat16": 2250.0, "float16": 2250.0, "float32": 80.0}),
    ("h200", {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
    ("h100 pcie", {"bfloat16": 756.0, "float16": 756.0, "float32": 51.0}),
    ("h100", {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}),
    ("a100", {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5}),
    ("l40s", {"bfloat16": 362.0, "float16": 362.0, "float32": 91.6}),
    ("l4", {"bfloat16": 121.0, "float16": 121.0, "float32": 30.3}),
    ("a10", {"bfloat16": 125.0, "float16": 125.0, "float32": 31.2}),
    ("v100", {"float16": 125.0, "float32": 15.7}),
    ("t4", {"float16": 65.0, "float32": 8.1}),
    ("mi300x", {"bfloat16": 1307.4, "float16": 1307.4, "float32": 163.4}),
]


def datasheet_tflops(device_name: str) -> dict[str, float] | None:
    """The datasheet's dense TFLOP/s per dtype of the GPU called ``device_name`` (as
    ``torch.cuda.get_device_name`` or a trace's ``deviceProperties`` name it), or None
    when it is not in the table."""
    name = device_name.lower()
    for fragment, table in _PEAK_TFLOPS:
        if fragment in name:
            return table
    return None


def given_peak_flops_per_s(peak_tflops: float) -> int:
    """The user's ``peak_tflops`` in FLOP/s, checked (a positive number)."""
    check_peak_tflops(peak_tflops)
    return int(peak_tflops * 1e12)


def check_peak_tflops(peak_tflops: object) -> float | None:
    """``peak_tflops`` as given (a user's value, any type), or a ValueError saying what
    was expected."""
    if peak_tflops is None:
        return None
    if isinstance(peak_tflops, bool) or not (isinstance(peak_tflops, (int, float)) and peak_tflops > 0):
        raise ValueError(f"peak_tflops must be a positive number of TFLOP/s (an H100's bf16: 989), got {peak_tflops!r}")
    return peak_tflops
