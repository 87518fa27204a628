"""Turning the CLI's SPEC strings into a model and its inputs.

- ``zoo:NAME``: a built-in model (``layerscope.zoo``), with its example inputs.
- ``transformers:ClassName``: that class built from its default config, random weights,
  nothing downloaded, with a default input for its ``main_input_name``.
- ``package.module:callable`` or ``path/to/file.py:callable``: the callable returns an
  ``nn.Module`` (for ``--inputs``, a Tensor, tuple or dict).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from layerscope.errors import InputsError, SpecError

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "double": torch.float64,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
    "bool": torch.bool,
}  # fmt: skip


@dataclass
class Resolved:
    """A model built from a SPEC, and the inputs it comes with (None: the caller must
    supply them)."""

    model: nn.Module
    inputs: Any
    label: str


def parse_dtype(text: str) -> torch.dtype:
    try:
        return _DTYPES[text.lower()]
    except KeyError:
        raise InputsError(f"unknown dtype {text!r}; expected one of: {', '.join(sorted(_DTYPES))}") from None


def parse_shape(text: str) -> tuple[tuple[int, ...], torch.dtype]:
    """``1x3x224x224`` or ``1,3,224,224``, optionally ``:dtype`` (``1x128:int64``).

    Every size must be there: ``8x`` or ``8xx3`` is a mistake, never the shape ``(8,)``."""
    shape_text, colon, dtype_text = text.partition(":")
    parts = re.split(r"\s*[x,]\s*", shape_text.strip())
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d < 0 for d in dims) or (colon and not dtype_text):
        raise InputsError(
            f"cannot parse input shape {text!r}; expected sizes separated by 'x' or ',', "
            "optionally with a dtype, e.g. 1x3x224x224 or 8,128:int64"
        )
    return dims, parse_dtype(dtype_text) if dtype_text else torch.float32


def tensor_for(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """A deterministic random tensor: uniform floats, or small non-negative integers
    (valid token ids for any vocabulary)."""
    if dtype.is_floating_point:
        return torch.rand(shape, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    return torch.randint(0, 100, shape, generator=generator, dtype=dtype)


def _load_callable(spec: str, what: str) -> Callable[..., Any]:
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise SpecError(
            f"cannot read {what} SPEC {spec!r}; expected 'package.module:callable', "
            "'path/to/file.py:callable', 'zoo:NAME' or 'transformers:ClassName'"
        )
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target)
        if not path.is_file():
            raise SpecError(f"{what} SPEC {spec!r}: no such file {target!r}")
        module_name = f"_layerscope_spec_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise SpecError(f"{what} SPEC {spec!r}: cannot import {target!r} as Python")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            raise SpecError(f"{what} SPEC {spec!r}: importing {target!r} raised {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise SpecError(f"{what} SPEC {spec!r}: cannot import {target!r} ({exc})") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise SpecError(f"{what} SPEC {spec!r}: {target!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise SpecError(f"{what} SPEC {spec!r}: {attr!r} is not callable (it is of type {type(obj).__name__})")
    return obj


def resolve_model(spec: str, *, batch_size: int = 1, device: torch.device | None = None) -> Resolved:
    """Build the model a SPEC names, with its default inputs where it has some.

    With ``device`` the model is constructed under ``torch.device(device)`` (for the
    meta device: no memory is allocated for its weights).
    """
    building = torch.device(device) if device is not None else contextlib.nullcontext()
    kind, _, name = spec.partition(":")
    if kind == "zoo":
        from layerscope import zoo

        try:
            entry = zoo.get(name)
        except KeyError as exc:
            raise SpecError(str(exc.args[0])) from None
        with building:
            model = entry.build()
        return Resolved(model, entry.example_inputs(batch_size), f"zoo:{entry.name}")
    if kind == "transformers":
        return _resolve_transformers(name, batch_size, building)
    factory = _load_callable(spec, "model")
    try:
        with building:
            model = factory()
    except Exception as exc:
        raise SpecError(f"model SPEC {spec!r}: calling it raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise SpecError(
            f"model SPEC {spec!r} returned an object of type {type(model).__name__}; "
            "it must return a torch.nn.Module"
        )
    return Resolved(model, None, spec)


def resolve_inputs(spec: str) -> Any:
    """Call the ``--inputs`` SPEC; it must return a Tensor, a tuple/list or a dict."""
    factory = _load_callable(spec, "inputs")
    try:
        inputs = factory()
    except Exception as exc:
        raise SpecError(f"inputs SPEC {spec!r}: calling it raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(inputs, (torch.Tensor, tuple, list, dict)):
        raise SpecError(
            f"inputs SPEC {spec!r} returned an object of type {type(inputs).__name__}; it must return a Tensor, "
            "a tuple/list of positional arguments or a dict of keyword arguments"
        )
    return inputs


def _resolve_transformers(class_name: str, batch_size: int, building: Any) -> Resolved:
    try:
        import transformers
    except ImportError:
        raise SpecError(
            "transformers: SPECs need the 'transformers' package: pip install transformers"
        ) from None
    cls = getattr(transformers, class_name, None)
    if cls is None or not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise SpecError(
            f"transformers has no model class {class_name!r}; expected a class such as "
            "BertModel, GPT2LMHeadModel or ViTModel"
        )
    config_class = getattr(cls, "config_class", None)
    if config_class is None:
        raise SpecError(f"transformers.{class_name} names no config_class to build it from")
    config = config_class()
    with building:
        model = cls(config)  # random weights from the default config: nothing is downloaded
    return Resolved(model, default_transformers_inputs(model, batch_size), f"transformers:{class_name}")


def default_transformers_inputs(model: nn.Module, batch_size: int, seq_len: int = 128) -> dict[str, Any]:
    """A sensible input for a transformers model, by its ``main_input_name``."""
    config = model.config  # type: ignore[attr-defined]
    name = getattr(model, "main_input_name", "input_ids")
    generator = torch.Generator().manual_seed(0)
    if name == "input_ids":
        vocab = int(getattr(config, "vocab_size", 1000) or 1000)
        limit = int(getattr(config, "max_position_embeddings", seq_len) or seq_len)
        length = min(seq_len, limit)
        ids = torch.randint(0, vocab, (batch_size, length), generator=generator)
        return {"input_ids": ids}
    if name == "pixel_values":
        channels = int(getattr(config, "num_channels", 3))
        size = getattr(config, "image_size", 224)
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        return {"pixel_values": torch.rand((batch_size, channels, height, width), generator=generator)}
    raise SpecError(
        f"no default input for {type(model).__name__} (its main input is {name!r}); "
        "pass --inputs SPEC naming a callable that returns the inputs"
    )
