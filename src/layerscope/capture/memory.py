"""Where memory is measured: the storages a pass allocates, frees and saves for backward.

Memory is counted in *logical* bytes: a storage's full size, once, however many views
share it, the same way on every device. The op mode hands each op's outputs to
:class:`StorageTracker`, which numbers every storage the op allocated (an output storage
that was not one of its inputs and is not tracked yet) and holds a weak reference to it;
when the storage dies the reference's callback records a ``Free``. Nothing is kept alive:
the tracker holds no tensor and no storage, and forgets everything when the pass ends.

Activations are read from the autograd graph, never by hooking autograd: after a module's
forward (and when backward starts) the tracker walks the graph nodes created in the pass
and reads what each node saved (``node._raw_saved_*``, which does not unpack, so
activation checkpointing's saved objects are never recomputed) and records ``Saved`` for
the storages it tracks. Saved parameters and inputs the pass did not allocate are not
activations.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn

from layerscope.capture._torch import node_sequence_nr, saved_attributes, storage_key
from layerscope.model.raw import NO_SEQ, Adopt, DeviceMem, Event, Free, Grad, Optim, Saved

Append = Callable[[Event], None]


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an op's output or a module's output (tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())


def _storage(tensor: torch.Tensor) -> Any:
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # sparse, nested or a subclass without a plain storage


def _input_storages(args: Any, kwargs: Any) -> set[int]:
    """Addresses of the storages of an op's tensor arguments (flat, or in lists)."""
    found: set[int] = set()
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            storage = _storage(value)
            if storage is not None:
                found.add(storage_key(storage))
        elif isinstance(value, (tuple, list, dict)):
            for tensor in tensors_in(value):
                storage = _storage(tensor)
                if storage is not None:
                    found.add(storage_key(storage))
    return found


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        storage = _storage(tensor)
        if storage is None or storage_key(storage) in seen:
            continue
        seen.add(storage_key(storage))
        total += storage.nbytes()
    return total


def bytes_by_dtype(tensors: Iterable[torch.Tensor]) -> dict[str, int]:
    """Bytes of the distinct storages behind ``tensors``, by dtype (``"float32"``...)."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for tensor in tensors:
        storage = _storage(tensor)
        if storage is None or storage_key(storage) in seen:
            continue
        seen.add(storage_key(storage))
        name = str(tensor.dtype).replace("torch.", "")
        out[name] = out.get(name, 0) + storage.nbytes()
    return dict(sorted(out.items()))


def packed_weights(module: nn.Module) -> list[torch.Tensor]:
    """The weights a quantized module keeps packed, outside its parameters
    (``DynamicQuantizedLinear``, quantized ``Conv2d``: ``weight()`` and ``bias()`` are
    methods there): counted as its parameters, at their stored size (qint8: 1 byte),
    never as 0."""
    if not type(module).__module__.startswith("torch.ao.nn.quantized"):
        return []
    found: list[torch.Tensor] = []
    for name in ("weight", "bias"):
        read = getattr(module, name, None)
        if callable(read):
            try:
                value = read()
            except Exception:  # a module whose packed weights cannot be read back
                continue
            if isinstance(value, torch.Tensor):
                found.append(value)
    return found


def model_memory(model: nn.Module) -> dict[str, Any]:
    """Parameter and buffer bytes of ``model`` by dtype (each storage once; a quantized
    module's packed weights among the parameters, :func:`packed_weights`)."""
    packed = [t for module in model.modules() for t in packed_weights(module)]
    return {
        "param_bytes_by_dtype": bytes_by_dtype([*model.parameters(), *packed]),
        "buffer_bytes_by_dtype": bytes_by_dtype(model.buffers()),
    }


def saved_tensors(roots: Iterable[Any], min_seq: int, walked: set[int]) -> Iterator[torch.Tensor]:
    """The tensors saved for backward by the autograd nodes reachable from ``roots``
    numbered from ``min_seq`` on (the ones a pass created), each node once (``walked``
    holds the numbers already read). ``node._raw_saved_*`` neither unpacks nor runs
    hooks: a checkpointed region is never recomputed."""
    stack = [node for node in roots if node is not None]
    while stack:
        node = stack.pop()
        try:
            seq = node_sequence_nr(node)
        except (AttributeError, RuntimeError):
            continue
        if seq == NO_SEQ or seq < min_seq or seq in walked:
            continue
        walked.add(seq)
        for name in saved_attributes(node):
            try:
                saved = getattr(node, name)
            except RuntimeError:
                continue  # already released (a second backward through the graph)
            for item in saved if isinstance(saved, (tuple, list)) else (saved,):
                try:
                    data = item.data
                except (AttributeError, RuntimeError):
                    continue
                if isinstance(data, torch.Tensor):
                    yield data
        for next_node, _ in node.next_functions:
            if next_node is not None:
                stack.append(next_node)


def saved_storages(roots: Iterable[Any], min_seq: int | None) -> list[int]:
    """Addresses of the storages saved by the nodes a forward created (``min_seq`` on)."""
    found: list[int] = []
    seen: set[int] = set()
    for tensor in saved_tensors(roots, min_seq or 0, set()):
        storage = _storage(tensor)
        try:
            ptr = storage.data_ptr() if storage is not None and storage.nbytes() else None
        except RuntimeError:  # a storage already released
            ptr = None
        if ptr is not None and ptr not in seen:
            seen.add(ptr)
            found.append(ptr)
    return found


class StorageTracker:
    """The storages of one pass, by serial number; see the module docstring."""

    def __init__(self, append: Append, clock: Callable[[], int], device: torch.device) -> None:
        self._append = append
        self._clock = clock
        self._serial_of: dict[int, int] = {}  # storage address -> serial
        self._refs: dict[int, tuple[Any, int, int]] = {}  # id(weakref) -> (ref, address, serial)
        self._next = 0
        self._active = True
        self._min_seq = 0
        self._walked: set[int] = set()
        self._graph_task = -1
        self._cuda = device if device.type == "cuda" and torch.cuda.is_available() else None
        self._device_peak = 0
        self._device_reserved = 0

    # -- storages -----------------------------------------------------------------
    def _on_free(self, ref: Any) -> None:
        entry = self._refs.pop(id(ref), None)
        if entry is None or not self._active:
            return
        _, address, serial = entry
        if self._serial_of.get(address) == serial:
            del self._serial_of[address]
        self._append(Free(t_ns=self._clock(), serial=serial))

    def _track(self, storage: Any, address: int) -> int:
        serial = self._next
        self._next += 1
        ref = weakref.ref(storage, self._on_free)
        self._refs[id(ref)] = (ref, address, serial)
        self._serial_of[address] = serial
        return serial

    def serial(self, tensor: torch.Tensor) -> int | None:
        storage = _storage(tensor)
        return None if storage is None else self._serial_of.get(storage_key(storage))

    def allocated(self, out: Any, args: Any, kwargs: Any, fresh: bool = False) -> tuple[tuple[int, int], ...] | None:
        """``(serial, nbytes)`` of each storage ``out`` holds that the op allocated;
        ``fresh`` ops (``aten::lift_fresh``) return a tensor just made outside the
        dispatcher (``torch.tensor(...)``): its storage is new though it is an input."""
        # Called for every op: the common shapes (one tensor, a flat tuple) go first.
        if type(out) is torch.Tensor:
            outputs: Any = (out,)
        elif type(out) is tuple and all(type(t) is torch.Tensor or t is None for t in out):
            outputs = out
        else:
            outputs = tuple(tensors_in(out))
        found: list[tuple[int, int]] | None = None
        inputs: set[int] | None = set() if fresh else None
        serial_of = self._serial_of
        for tensor in outputs:
            if tensor is None:
                continue
            storage = _storage(tensor)
            if storage is None:
                continue
            address = storage_key(storage)
            if address in serial_of:
                continue
            nbytes = storage.nbytes()
            if not nbytes:
                continue
            if inputs is None:
                inputs = _input_storages(args, kwargs)
            if address in inputs:
                continue  # a view of an input (a parameter, say): nothing new
            if found is None:
                found = []
            found.append((self._track(storage, address), nbytes))
        if self._cuda is not None:
            self._sample_device()
        return None if found is None else tuple(found)

    def adopt(self, tensors: Iterable[torch.Tensor], category: str, *, since_start: bool) -> None:
        """Record memory that was live before the tracker saw it, tracked from now on."""
        now = self._clock()
        for tensor in tensors:
            storage = _storage(tensor)
            if storage is None or storage_key(storage) in self._serial_of or not storage.nbytes():
                continue
            serial = self._track(storage, storage_key(storage))
            self._append(Adopt(t_ns=now, serial=serial, nbytes=storage.nbytes(), category=category, since_start=since_start))

    def constant(self, nbytes: int, category: str) -> None:
        """Memory live for the whole pass that is not tracked further (the parameters)."""
        self._append(Adopt(t_ns=self._clock(), serial=None, nbytes=nbytes, category=category, since_start=True))

    # -- gradients and optimizer state ------------------------------------------------
    def gradient(self, owner: int, variable: torch.Tensor, out: Any) -> None:
        """A parameter's gradient was accumulated by the op that returned ``out``."""
        serial = None
        for tensor in tensors_in(out):
            serial = self.serial(tensor)
            break
        nbytes = variable.numel() * variable.element_size()
        self._append(Grad(t_ns=self._clock(), owner=owner, nbytes=nbytes, serial=serial))

    def optimizer_pre(self, optimizer: torch.optim.Optimizer) -> None:
        # State that exists before this step and was not allocated in the pass was live
        # from its start (the moments of earlier steps).
        self.adopt(optimizer_state_tensors(optimizer), "optimizer_state", since_start=True)

    def optimizer_post(self, optimizer: torch.optim.Optimizer) -> None:
        by_key = optimizer_state_bytes(optimizer)
        self._append(Optim(t_ns=self._clock(), name=type(optimizer).__name__, state_bytes_by_key=by_key, ident=id(optimizer)))

    # -- activations --------------------------------------------------------------------
    def begin(self, min_seq: int | None) -> None:
        """Start of the pass: only autograd nodes numbered from ``min_seq`` on are new."""
        self._min_seq = min_seq if min_seq is not None else 0

    def walk_saved(self, roots: Iterable[Any]) -> None:
        """Record ``Saved`` for the tracked storages saved by nodes reachable from ``roots``."""
        serial_of = self._serial_of
        for tensor in saved_tensors(roots, self._min_seq, self._walked):
            storage = _storage(tensor)
            if storage is not None:
                serial = serial_of.get(storage_key(storage))
                if serial is not None:
                    self._append(Saved(serial))

    def module_output(self, output: Any) -> None:
        self.walk_saved(t.grad_fn for t in tensors_in(output) if t.grad_fn is not None)

    def backward_node(self, node: Any, graph_task: int) -> None:
        """Called for each op autograd's engine runs: the first one of a backward walks
        the graph from there (the loss's nodes, and any the forward walks missed)."""
        if graph_task != self._graph_task:
            self._graph_task = graph_task
            self.walk_saved((node,))

    # -- the caching allocator (CUDA) ------------------------------------------------------
    def _sample_device(self) -> None:
        allocated = torch.cuda.memory_allocated(self._cuda)
        if allocated > self._device_peak:
            self._device_peak = allocated
            self._device_reserved = torch.cuda.memory_reserved(self._cuda)

    def close(self) -> None:
        """End of the pass: report the allocator's peak and forget every storage."""
        if self._cuda is not None:
            self._sample_device()
            self._append(DeviceMem(allocated_peak_bytes=self._device_peak, reserved_at_peak_bytes=self._device_reserved))
        self._active = False
        self._refs.clear()
        self._serial_of.clear()
        self._walked.clear()


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        if isinstance(state, dict):
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    yield value


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of an optimizer's state by key (``exp_avg``, ...), each storage once."""
    by_key: dict[str, int] = {}
    seen: set[int] = set()
    for state in optimizer.state.values():
        if not isinstance(state, dict):
            continue
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            storage = _storage(value)
            if storage is None or storage_key(storage) in seen:
                continue
            seen.add(storage_key(storage))
            by_key[str(key)] = by_key.get(str(key), 0) + storage.nbytes()
    return by_key


def optimizer_hooks(
    stack: ExitStack,
    pre: Callable[[torch.optim.Optimizer], None],
    post: Callable[[torch.optim.Optimizer], None],
) -> None:
    """Call ``pre(optimizer)`` and ``post(optimizer)`` around every optimizer's ``step``
    for the pass (global hooks, removed on exit)."""
    from torch.optim import optimizer as optim_module

    register_pre = getattr(optim_module, "register_optimizer_step_pre_hook", None)
    register_post = getattr(optim_module, "register_optimizer_step_post_hook", None)
    if register_pre is None or register_post is None:
        return
    stack.callback(register_pre(lambda opt, args, kwargs: pre(opt)).remove)
    stack.callback(register_post(lambda opt, args, kwargs: post(opt)).remove)
