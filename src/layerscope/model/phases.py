"""The phases a node's work is split into, named once for the tree and its op table."""

#: ``recompute`` is forward work run again during backward (activation checkpointing);
#: it is never counted as ``forward``.
PHASES: tuple[str, ...] = ("forward", "backward", "recompute")
