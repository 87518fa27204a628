"""The modules whose backward is running. Pure: no torch.

Backward ops are not frames: each belongs to the module whose forward created its
autograd node. While a module's backward ops run, that module and its ancestors are
"running", outermost first: the *chain*. It moves as the owner changes (entries common to
the old and new owner stay open), so its entries nest in time like frames do, and
anything that needs backward spans (memory peaks, the timeline, the trace) listens to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

#: What the walker knows a node by: a module of the model by its index in the model's
#: table (an int: the walk hashes and compares one per event), a node the run made (a
#: label, a step part) by its path (a str). The three functions below tell them apart;
#: nothing else does.
Key = int | str


def is_module(key: Key) -> TypeGuard[int]:
    """Whether ``key`` is a module of the model (its index), not a node the run made."""
    return type(key) is int


def is_made(key: Key) -> TypeGuard[str]:
    """Whether ``key`` is a node the run made (a label, a step part), known by its path."""
    return type(key) is str


def key_path(key: Key, paths: Sequence[str]) -> str:
    """The node's path: a module's from the model's table, a made node's its key."""
    return paths[key] if isinstance(key, int) else key


@dataclass(slots=True)
class Entry:
    """One running module of the chain: its key and when its backward work began. The
    memory ledger keeps the live bytes when it opened and their highest since in it."""

    key: Key
    t_open: int
    live_at_open: int = 0
    live_top: int = 0


class BackwardChain:
    """The owner of the running backward op and its ancestors, outermost first."""

    def __init__(self, ancestors: Callable[[Key], list[Key]]) -> None:
        self.entries: list[Entry] = []
        self._ancestors = ancestors
        #: ``opener(entry)`` after an entry opens; ``closer(entry, t, still_open)`` after
        #: it closes at ``t`` (innermost first).
        self.openers: list[Callable[[Entry], None]] = []
        self.closers: list[Callable[[Entry, int, list[Entry]], None]] = []

    @property
    def owner(self) -> Key | None:
        return self.entries[-1].key if self.entries else None

    def move(self, key: Key, t: int) -> None:
        """Backward work of ``key`` starts at ``t``."""
        entries = self.entries
        if entries and entries[-1].key == key:
            return
        wanted = self._ancestors(key)
        keep = 0
        while keep < len(entries) and keep < len(wanted) and entries[keep].key == wanted[keep]:
            keep += 1
        self.close(t, keep=keep)
        for k in wanted[keep:]:
            entry = Entry(k, t)
            for opener in self.openers:
                opener(entry)
            entries.append(entry)

    def close(self, t: int, *, keep: int = 0) -> None:
        """Close all but the outermost ``keep`` entries at ``t``."""
        entries = self.entries
        while len(entries) > keep:
            entry = entries.pop()
            for closer in self.closers:
                closer(entry, t, entries)
