"""The one module that turns numbers into strings for people."""

from __future__ import annotations

import re
from typing import Any


def _sig4(value: float) -> str:
    """Four significant digits for values in [1, 1000): 1.808, 14.03, 141.4.

    The decimals are chosen from the value as rounded, so 99.999 prints 100.0, not
    100.00."""
    for decimals, floor in ((3, 10), (2, 100)):
        if round(value, decimals) < floor:
            return f"{value:.{decimals}f}"
    return f"{value:.1f}"


def time_ns(value: int | None) -> str:
    """``1808000`` -> ``1.808ms``; ``None`` -> ``""`` (not measured)."""
    if value is None:
        return ""
    if value < 1_000:
        return f"{value}ns"
    for unit, scale in (("us", 1e3), ("ms", 1e6), ("s", 1e9)):
        scaled = value / scale
        if scaled < 1000 or unit == "s":
            # Rounding may carry to 1000.0: show it in the next unit instead.
            text = _sig4(scaled)
            if float(text) < 1000 or unit == "s":
                return f"{text}{unit}"
    return f"{value / 1e9:.1f}s"


def count(value: int | None, billions: str = "G") -> str:
    """``61100840`` -> ``61.10M``; below a thousand, the integer itself. ``billions`` is
    the suffix of 1e9: ``G`` for FLOPs and MACs (GFLOPs), ``B`` for parameters
    (:func:`param_count`)."""
    if value is None:
        return ""
    if abs(value) < 1000:
        return str(value)
    for suffix, scale in (("K", 1e3), ("M", 1e6), (billions, 1e9), ("T", 1e12)):
        scaled = value / scale
        if abs(scaled) < 999.995 or suffix == "T":
            return f"{scaled:.2f}{suffix}"
    return str(value)


def param_count(value: int | None) -> str:
    """A parameter count as its readers say it: ``6.74B`` for Llama-7B's 6,738,415,616
    (billions as DeepSpeed and torchinfo print them), ``61.10M``, ``512``."""
    return count(value, billions="B")


def counted(value: int | None, partial: bool) -> str:
    """A FLOP or MAC count that may leave out ops it could not count (``partial``):
    ``1.20K + ?``, or ``?`` where nothing was counted; else :func:`count`'s."""
    if not partial:
        return count(value)
    return f"{count(value)} + ?" if value else "?"


#: torch's long range names, as a tree shows them: the data loader's ``__next__`` takes
#: 62 characters as torch names it (HF's Trainer and Lightning show it every step).
#: A compiled graph's call names its 52-character cache key: its first 8 characters
#: tell the graphs of one trace apart.
_SHORT_NAMES = (
    (re.compile(r"enumerate\(DataLoader\)#_\w*DataLoaderIter\.__next__"), "DataLoader.__next__"),
    (re.compile(r"## Call CompiledFxGraph (\w{8})\w+ ##"), r"CompiledFxGraph \1…"),
)


def node_name(name: str) -> str:
    """A node's name as a tree shows it: torch's long range names shortened."""
    for pattern, short in _SHORT_NAMES:
        name = pattern.sub(short, name)
    return name


def memory_category(key: str, has_buffers: bool = False) -> str:
    """A memory category as it is shown: ``optimizer_state`` -> ``optimizer state``. The
    live bytes of ``parameters`` hold the module's buffers too: where it has buffers
    (``has_buffers``: ``Profile.memory.buffer_bytes_by_dtype``), the category says so,
    as the footer's "parameters ...; buffers ..." line counts them apart."""
    if key == "parameters" and has_buffers:
        return "parameters and buffers"
    return key.replace("_", " ")


def nbytes(value: int | None) -> str:
    """``1048576`` -> ``1.00 MiB``."""
    if value is None:
        return ""
    if abs(value) < 1024:
        return f"{value} B"
    scaled = float(value)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        scaled /= 1024
        if abs(scaled) < 1023.995 or unit == "TiB":
            break
    return f"{scaled:.2f} {unit}"


def params(value: int | None, param_bytes: int | None = None) -> str:
    """A parameter count with its bytes: ``61.71K (241.04 KiB)``; ``?`` when the count is
    not known (a profile built from a trace recorded without the model), as the tables
    show an op with no FLOP formula: unknown, never 0."""
    if value is None:
        return "?"
    return param_count(value) + ("" if param_bytes is None else f" ({nbytes(param_bytes)})")


def percent(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return ""
    return f"{100.0 * part / whole:.1f}%"


def shape(value: Any) -> str:
    """A shape list as ``[1, 3, 224, 224]``; nested lists keep their brackets."""
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return "[" + ", ".join(str(v) for v in value) + "]"
    # Inside a container a non-tensor (recorded as None) shows as "-", never a gap.
    if isinstance(value, list):
        return "[" + ", ".join(shape(v) if v is not None else "-" for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shape(v) if v is not None else '-'}" for k, v in value.items()) + "}"
    return str(value)


def rate(flops: int | None, time_ns: int | None) -> str:
    """FLOPs per second with a unit: ``12.50 GFLOP/s``, ``1.20 TFLOP/s``."""
    if not flops or not time_ns:
        return ""
    per_second = flops * 1e9 / time_ns
    for unit, scale in (("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6), ("KFLOP/s", 1e3)):
        if per_second >= scale:
            return f"{per_second / scale:.2f} {unit}"
    return f"{per_second:.0f} FLOP/s"


def mfu(flops: int | None, time_ns: int | None, peak_flops_per_s: float | None) -> str:
    """Achieved FLOP/s as a percentage of the hardware peak: ``41.3%``."""
    if not flops or not time_ns or not peak_flops_per_s:
        return ""
    return f"{100.0 * flops * 1e9 / time_ns / peak_flops_per_s:.1f}%"


def intensity(flops: int | None, nbytes: int | None) -> str:
    """Arithmetic intensity, FLOPs per byte moved: ``12.5 FLOP/B``."""
    if flops is None or not nbytes:
        return ""
    return f"{flops / nbytes:.2f} FLOP/B"


# -- other tools' layouts (layerscope.compat): their units, so habits and greps carry over --


def si_number(value: float, units: str | None = None, precision: int = 2) -> str:
    """A number in the DeepSpeed flops profiler's style, the unit's prefix after a space:
    ``714188480`` -> ``714.19 M``, ``0.0123`` -> ``12.3 m``, ``0`` -> ``0 ``. ``units``
    forces a prefix (``"G"``); values are rounded to ``precision`` decimals, then printed
    with ``:g`` (no trailing zeros)."""
    scales = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "": 1.0, "m": 1e-3, "u": 1e-6}
    if units is None:
        units = next((prefix for prefix, scale in scales.items() if value >= scale), "u")
        if value == 0:
            units = ""
    return f"{round(value / scales.get(units, 1.0), precision):g} {units}"


def ds_macs(macs: float) -> str:
    """``714.19 MMACs``."""
    return si_number(macs) + "MACs"


def ds_params(params: float) -> str:
    """``61.1 M``; billions read ``B``, as DeepSpeed prints them."""
    return si_number(params).replace("G", "B").strip()


def ds_seconds(seconds: float) -> str:
    """``12.3 ms``."""
    return si_number(seconds) + "s"


def ds_rate(flops_per_second: float) -> str:
    """``116.2 GFLOPS`` (DeepSpeed's spelling of FLOP/s)."""
    return si_number(flops_per_second) + "FLOPS"


def ds_share(part: float | None, whole: float | None) -> str:
    """``9.84%``: rounded to two decimals, no trailing zeros; ``0%`` of nothing."""
    if not part or not whole:
        return "0%"
    return f"{round(100 * part / whole, 2):g}%"


def profiler_time(time_us: float) -> str:
    """A time in microseconds as torch.profiler's tables print it: ``1.808ms``, ``16.481us``."""
    if time_us >= 1e6:
        return f"{time_us / 1e6:.3f}s"
    if time_us >= 1e3:
        return f"{time_us / 1e3:.3f}ms"
    return f"{time_us:.3f}us"


def profiler_share(time_us: float, total_us: float) -> str:
    """``12.34%`` of ``total_us``, as torch.profiler's tables print shares (``NaN`` of 0)."""
    if not total_us:
        return "NaN"
    return f"{time_us * 100.0 / total_us:.2f}%"


def profiler_memory(nbytes: int | None, *, legacy: bool = False) -> str:
    """Bytes as torch.profiler's tables print them (``756.50 KB``); ``legacy`` gives the
    spelling of torch 1.x that torchprof printed (``756.50 Kb``, ``0 b``); None is blank."""
    if nbytes is None:
        return ""
    units = ("b", "Kb", "Mb", "Gb") if legacy else ("B", "KB", "MB", "GB")
    for power in (3, 2, 1):
        if abs(nbytes) >= 1024**power:
            return f"{nbytes / 1024**power:.2f} {units[power]}"
    return f"{nbytes} {units[0]}"
