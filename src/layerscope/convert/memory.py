"""Memory while a window's records are read in time order: storages by address, and
layerscope's notes (memory live before the step, what a forward saved, gradients,
optimizer state) turned into records.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from layerscope.model.raw import NO_SEQ, Adopt, Event, Free, Grad, Op, Optim, Saved

#: The CUDA caching allocator's smallest block, and the unit it rounds every request up
#: to (``kMinBlockSize`` and ``round_size`` in torch's c10/cuda/CUDACachingAllocator.cpp).
CUDA_BLOCK_BYTES = 512


def held_bytes(nbytes: int, device_type: str) -> int:
    """A storage of ``nbytes`` logical bytes as the allocation events of its device size
    it, so that memory live before a step and the step's own allocations follow one rule:
    on CUDA the caching allocator's block (its events report ``round_size``: up to a
    multiple of 512 bytes), elsewhere the logical size (the CPU's events report exact
    sizes). NB: ``roundup_power2_divisions`` in ``PYTORCH_CUDA_ALLOC_CONF`` rounds larger
    requests further; that setting is not read, its default rule is assumed."""
    if device_type != "cuda" or nbytes <= 0:
        return nbytes
    return (nbytes + CUDA_BLOCK_BYTES - 1) // CUDA_BLOCK_BYTES * CUDA_BLOCK_BYTES


class Note(NamedTuple):
    """Where note ``at`` of the window was taken (a ``layerscope.note#K`` range)."""

    t_ns: int
    at: int


class Reads(NamedTuple):
    """The allocations (ids) that the ops of autograd node ``seq``'s work read, less the
    gradients the node was given."""

    t_ns: int
    seq: int
    ids: tuple[int, ...]


class StepMemory:
    """Storages by address while the records are read in time order: allocations'
    ids become the serials of this step's storages, memory that was live before the
    step (adopted by address in a note) gets serial ``-address``, and notes become
    ``Adopt``, ``Saved``, ``Grad`` and ``Optim`` records.

    What the model's forward saved is read from the autograd graph at its exit (a
    note). Nodes made outside it (a loss written inline) are read by no Python moment
    before their backward releases what they saved, so for them the events stand in:
    a storage allocated by a forward op of the step and read by such a node's ops
    (``_Reads``) was saved by it, as autograd's formulas read only what they saved and
    the gradients they are given."""

    def __init__(self, ptr_of: dict[int, int], notes: list[list[tuple[Any, ...]]]) -> None:
        self.ptr_of = ptr_of
        self.notes = notes
        self.live: dict[int, int] = {}  # address -> allocation id
        self.step: set[int] = set()
        #: This step's storages allocated by forward ops (not by backward's).
        self.forward_made: set[int] = set()
        #: The autograd numbers each forward of the model took this step: ``[since, until)``.
        self.forwards: list[tuple[int, int]] = []

    def new_step(self) -> None:
        self.step = set()
        self.forward_made = set()
        self.forwards = []

    def serial(self, ptr: int) -> int | None:
        """This step's storage at ``ptr``; None if it was live before the step."""
        found = self.live.get(ptr)
        return found if found in self.step else None

    def see(self, record: Any) -> list[Event] | None:
        """Note what ``record`` does to the storages; what stands in its place, if not itself."""
        kind = type(record)
        if kind is Op and record.allocs:
            for serial, _ in record.allocs:
                self.live[self.ptr_of[serial]] = serial
                self.step.add(serial)
                if record.grad is None:
                    self.forward_made.add(serial)
        elif kind is Free:
            ptr = self.ptr_of.get(record.serial, 0)
            if self.live.get(ptr) == record.serial:
                del self.live[ptr]
            if record.serial not in self.step:
                return [record._replace(serial=-ptr)]  # memory adopted by address, if it was
        elif kind is Note:
            return self.resolve(record)
        elif kind is Reads:
            return self.saved_outside(record)
        return None

    def saved_outside(self, reads: Reads) -> list[Event]:
        """``Saved`` for what a node made outside the model's forwards read: storages of
        the step's forward still live (the model's own nodes were read at its exit)."""
        if reads.seq == NO_SEQ or any(since <= reads.seq < until for since, until in self.forwards):
            return []
        out: list[Event] = []
        for serial in reads.ids:
            if serial in self.forward_made and self.live.get(self.ptr_of.get(serial, 0)) == serial:
                out.append(Saved(serial))
        return out

    def resolve(self, note: Note) -> list[Event]:
        out: list[Event] = []
        t = note.t_ns
        for item in self.notes[note.at]:
            what = item[0]
            if what == "adopt":  # ("adopt", ptr, nbytes, category, since_start, device type)
                _, ptr, nbytes, category, since_start, device = item
                if self.serial(ptr) is None:
                    out.append(Adopt(t, -ptr, held_bytes(nbytes, device), category, since_start))
            elif what == "constant":  # ("constant", [(nbytes, device type), ...], category)
                out.append(Adopt(t, None, sum(held_bytes(n, device) for n, device in item[1]), item[2], True))
            elif what == "saved":  # ("saved", ptrs)
                for ptr in item[1]:
                    serial = self.serial(ptr)
                    if serial is not None:
                        out.append(Saved(serial))
            elif what == "forward":  # ("forward", since, until): the numbers its nodes took
                self.forwards.append((item[1], item[2]))
            elif what == "grad":  # ("grad", ptr, owner, nbytes)
                _, ptr, owner, nbytes = item
                serial = self.serial(ptr)
                out.append(Grad(t, owner, nbytes, serial if serial is not None else -ptr))
            elif what == "optim":  # ("optim", name, bytes by key, ident)
                out.append(Optim(t, item[1], item[2], item[3]))
        return out
