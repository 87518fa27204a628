"""Communication: which ops and ranges are collectives, the bytes each moves, and the
factor that turns those bytes into bus bandwidth. Pure Python; no torch.

A collective is recognised by name:

- the ops of torch.distributed's process groups (``c10d::allreduce_``,
  ``c10d::_allgather_base_``, ...), of its functional collectives
  (``_c10d_functional::all_reduce``, ``_c10d_functional::wait_tensor``, ...), which is
  what DDP's reducer and FSDP run, and of symmetric memory (``symm_mem::``);
- the ranges process groups record around the work of a collective (``gloo:all_reduce``,
  ``nccl:all_reduce``) and ``record_param_comms``;
- the device kernels of collectives: NCCL's and RCCL's (``ncclDevKernel_AllReduce_...``,
  ``ncclKernel_...``, ``rcclKernel...``) and symmetric memory's
  (``multimem_all_reduce_kernel``, ``one_shot_all_reduce_kernel``): their device time is
  communication, never a module's compute.

**Bytes** follow the convention of bus-bandwidth figures: the size of the buffer the
collective is about. For an all-reduce, broadcast, reduce, send or receive it is the
tensor; for an all-gather the gathered output (all ranks' parts); for a reduce-scatter
and an all-to-all the input. Bus bandwidth is then ``bytes / time * bus_factor(name,
world_size)``: an all-reduce moves ``2 (n - 1) / n`` of its buffer over each rank's
link, an all-gather, reduce-scatter or all-to-all ``(n - 1) / n``, the others all of it.
"""

from __future__ import annotations

import functools
from typing import Any

#: Namespaces whose ops are collectives (or waits on them); ``symm_mem::`` holds the
#: all-reduces over symmetric memory that tensor parallelism runs without NCCL
#: (``symm_mem::multimem_all_reduce_``).
NAMESPACES = ("c10d::", "_c10d_functional::", "c10d_functional::", "symm_mem::")
#: Prefixes of the ranges process groups record around a collective's work.
RANGE_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:")
RANGE_NAMES = ("record_param_comms",)
#: How the device kernels of NCCL and RCCL begin (after C++'s ``void ``).
KERNEL_PREFIXES = ("ncclKernel", "ncclDevKernel", "rcclKernel", "rcclDevKernel")
#: Words in the names of the device kernels of symmetric memory's collectives (torch's
#: ``multimem_all_reduce_kernel``, ``one_shot_all_reduce_kernel``, ...) and of custom
#: all-reduces (``cross_device_reduce_1stage``).
KERNEL_WORDS = (
    "all_reduce_kernel", "allreduce_kernel", "all_gather_kernel", "reduce_scatter_kernel", "all_to_all_kernel",
    "cross_device_reduce", "symm_mem",
)

#: The kind of each collective, from the words in its name (checked in this order).
_KINDS = (
    ("reduce_scatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("all_gather", "all_gather"),
    ("allreduce", "all_reduce"),
    ("all_reduce", "all_reduce"),
    ("alltoall", "all_to_all"),
    ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "barrier"),
    ("wait", "wait"),
)

#: Which argument's tensors are the buffer, per kind: "first" (the first tensor
#: argument), "output" (what is gathered), "input" (the second argument of an op whose
#: first is its output).
_BUFFER = {
    "all_reduce": "first",
    "broadcast": "first",
    "reduce": "first",
    "send": "first",
    "recv": "first",
    "all_gather": "output",
    "gather": "input",
    "scatter": "output",
    "reduce_scatter": "input",
    "all_to_all": "input",
}


@functools.lru_cache(maxsize=1 << 16)
def is_communication(name: str | None) -> bool:
    """Whether an op, range or device kernel named ``name`` is a collective (or a wait
    on one). Asked of every op and kernel: names repeat, so each is judged once."""
    if not name:
        return False
    return (
        name.startswith(NAMESPACES) or name.startswith(RANGE_PREFIXES) or name in RANGE_NAMES
        or is_communication_kernel(name)
    )


@functools.lru_cache(maxsize=1 << 16)
def is_communication_kernel(name: str | None) -> bool:
    """Whether a device kernel named ``name`` is a collective's (NCCL, RCCL, symmetric
    memory): ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)``,
    ``void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(...)``."""
    if not name:
        return False
    bare = name[5:] if name.startswith("void ") else name
    if bare.startswith(KERNEL_PREFIXES):
        return True
    lower = name.lower()
    return any(word in lower for word in KERNEL_WORDS)


def kind(name: str) -> str | None:
    """``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ... of a
    collective's name; None when the name says nothing (``record_param_comms``)."""
    short = name.rsplit("::", 1)[-1].rsplit(":", 1)[-1].lower()
    for word, found in _KINDS:
        if word in short:
            return found
    return None


def bus_factor(name: str, world_size: int) -> float:
    """What bus bandwidth multiplies algorithm bandwidth (bytes / time) by."""
    n = max(1, int(world_size))
    found = kind(name)
    if found == "all_reduce":
        return 2 * (n - 1) / n
    if found in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def payload_bytes(name: str, args: tuple[Any, ...], out: Any, nbytes: Any) -> int:
    """Bytes of the buffer a collective call is about (see the module's docstring).
    ``nbytes(value)`` counts the bytes of the tensors (or tensor metadata) in a value,
    nested in lists; functional collectives return their result, which is the buffer of
    an all-gather."""
    found = kind(name)
    rule = _BUFFER.get(found or "")
    if rule is None:
        return 0
    tensors = [a for a in args if nbytes(a)]
    if not tensors:
        return 0
    functional = not name.startswith("c10d::")
    if rule == "first" or (functional and rule == "input"):
        return int(nbytes(tensors[0]))
    if rule == "output":
        return int(nbytes(out) if functional else nbytes(tensors[0]))
    return int(nbytes(tensors[1] if len(tensors) > 1 else tensors[0]))
