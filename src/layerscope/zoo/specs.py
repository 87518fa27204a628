"""Turning the CLI's SPEC strings into a model and its inputs.

- ``zoo:NAME``: a built-in model (``layerscope.zoo``), with its example inputs.
- ``transformers:ClassName``: that class built from its default config, random weights,
  nothing downloaded, with the inputs it needs built from its config
  (:func:`default_transformers_inputs`).
- ``package.module:callable`` or ``path/to/file.py:callable``: the callable returns an
  ``nn.Module`` (for ``--inputs``, a Tensor, tuple or dict).

torch is imported by the functions that build or make something, not by this module:
:func:`check_spec` and the parsers' errors answer before torch is loaded, so a
misspelt SPEC, dtype or shape is said at once.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerscope.base.errors import InputsError, SpecError

if TYPE_CHECKING:
    import torch
    from torch import nn

#: The dtype names the CLI takes, each to the name of its ``torch`` dtype.
_DTYPES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "double": "float64",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32",
    "bool": "bool",
}


@dataclass
class Resolved:
    """A model built from a SPEC, and the inputs it comes with (None: the caller must
    supply them)."""

    model: nn.Module
    inputs: Any
    label: str


def dtype_name(text: str) -> str:
    """The name of the ``torch`` dtype ``text`` names (``bf16``: ``bfloat16``), or an
    ``InputsError`` listing the names taken; torch is not imported."""
    try:
        return _DTYPES[text.lower()]
    except KeyError:
        raise InputsError(f"unknown dtype {text!r}; expected one of: {', '.join(sorted(_DTYPES))}") from None


def parse_dtype(text: str) -> torch.dtype:
    name = dtype_name(text)
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


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
    return dims, parse_dtype(dtype_text or "float32")


#: Integers are drawn below this when the model names no vocabulary.
DEFAULT_INT_LIMIT = 100


def tensor_for(
    shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, *, int_limit: int = DEFAULT_INT_LIMIT
) -> torch.Tensor:
    """A deterministic random tensor: uniform floats, or integers in ``[0, int_limit)``
    (token ids: pass the model's :func:`vocab_size`)."""
    import torch

    if dtype.is_floating_point:
        return torch.rand(shape, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    return torch.randint(0, int_limit, shape, generator=generator, dtype=dtype)


def vocab_size(model: nn.Module) -> int | None:
    """How many token ids ``model`` embeds: its config's ``vocab_size`` (the text
    config's, for a multimodal model), else the first ``nn.Embedding``'s
    ``num_embeddings``; None when it has neither."""
    from torch import nn

    size = getattr(_text_config(getattr(model, "config", None)), "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    return None


def check_spec(spec: str, *, config: dict[str, Any] | None = None) -> None:
    """Refuse, without importing torch or the model's code, a model SPEC that cannot be
    built: an unknown zoo name, ``transformers:`` without the package, a
    ``module:callable`` whose module or file is not there, ``config`` for a SPEC that
    takes none. What only building can tell (a class transformers lacks, a callable
    that raises) is said by :func:`resolve_model`."""
    kind, _, name = spec.partition(":")
    if config and kind != "transformers":
        raise SpecError(
            f"--config sets fields of a transformers: model's config; {spec!r} is not one "
            "(a zoo: model has a fixed size; a module:callable SPEC builds its own)"
        )
    if kind == "zoo":
        from layerscope import zoo

        try:
            zoo.get(name)
        except KeyError as exc:
            raise SpecError(str(exc.args[0])) from None
    elif kind == "transformers":
        if importlib.util.find_spec("transformers") is None:
            raise SpecError("transformers: SPECs need the 'transformers' package: pip install transformers")
    else:
        check_callable_spec(spec, "model")


def check_callable_spec(spec: str, what: str) -> tuple[str, str]:
    """A ``module:callable`` or ``file.py:callable`` SPEC's module (or file) and name, or
    a one-line ``SpecError`` when it is malformed or its file or module is not there.
    Only the parent packages of a dotted module are imported, as finding it needs."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise SpecError(
            f"cannot read {what} SPEC {spec!r}; expected 'package.module:callable', "
            "'path/to/file.py:callable', 'zoo:NAME' or 'transformers:ClassName'"
        )
    if _is_file(target):
        if not Path(target).is_file():
            raise SpecError(f"{what} SPEC {spec!r}: no such file {target!r}")
        return target, attr
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):  # a parent not there, or a module find_spec cannot place (__main__)
        found = None
    if found is None:
        try:  # it is not there (nothing of it runs): import's own words say why
            importlib.import_module(target)
        except ImportError as exc:
            raise SpecError(f"{what} SPEC {spec!r}: cannot import {target!r} ({exc})") from None
    return target, attr


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """The callable a ``module:callable`` or ``file.py:callable`` SPEC names (``what`` is
    the kind of SPEC, for the error); a one-line ``SpecError`` when it cannot be read."""
    target, attr = check_callable_spec(spec, what)
    if _is_file(target):
        path = Path(target)
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


def parse_config(text: str) -> dict[str, Any]:
    """``--config num_hidden_layers=2,hidden_size=256`` as a dict: each value an int, a
    float, true/false/none, or else a string; a clear error for anything else."""
    found: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise SpecError(f"--config {text!r}: {item!r} is not KEY=VALUE (e.g. num_hidden_layers=2,hidden_size=256)")
        found[key] = _config_value(raw.strip())
    if not found:
        raise SpecError(f"--config {text!r}: give KEY=VALUE pairs, e.g. num_hidden_layers=2,hidden_size=256")
    return found


#: What a config field takes, by its default's type, as --config's errors say it.
_CONFIG_TYPES = {bool: "true or false", int: "an int", float: "a number", str: "a string"}

#: Names of config fields that set a size: a count (layers, heads, positions, ...) or a
#: dimension (hidden, intermediate, head, vocabulary, image and patch sizes, ...).
_SIZE_NAME = re.compile(r"^(n|num|d)_|_num_|layer|head|hidden|size|dim|vocab|embd|position|channel|intermediate|ffn")


def size_fields(config: Any, base: Any) -> list[str]:
    """The fields of ``config`` (a transformers config) that set a size: ints (not bools)
    with a size's name, of the model's own config, not of ``base`` (``PretrainedConfig``,
    whose ``chunk_size_feed_forward`` is an int but sizes nothing)."""
    common = base.to_dict()
    return [
        key
        for key, value in config.to_dict().items()
        if key not in common and type(value) is int and _SIZE_NAME.search(key) and not key.endswith("_id")
    ]


def _expected_type(default: Any, value: Any) -> str | None:
    """What a config field whose default is ``default`` takes, when ``value`` is not that
    (None when it fits, or when the default says nothing: None, a list, a dict)."""
    kind = type(default)
    if kind not in (bool, int, float, str) or value is None:
        return None  # None is "unset" for many fields: the config itself judges it
    fits = type(value) is kind or (kind is float and type(value) is int)
    return None if fits else _CONFIG_TYPES[kind]


def _config_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def resolve_model(
    spec: str, *, batch_size: int = 1, device: torch.device | None = None, config: dict[str, Any] | None = None
) -> Resolved:
    """Build the model a SPEC names, with its default inputs where it has some.

    With ``device`` the model is constructed under ``torch.device(device)`` (for the
    meta device: no memory is allocated for its weights). ``config`` overrides fields
    of a ``transformers:`` model's default config (its size: ``num_hidden_layers``,
    ``hidden_size``, ...); other SPECs take none.
    """
    check_spec(spec, config=config)
    import torch
    from torch import nn

    building = torch.device(device) if device is not None else contextlib.nullcontext()
    kind, _, name = spec.partition(":")
    if kind == "zoo":
        from layerscope import zoo

        entry = zoo.get(name)
        with building:
            model = entry.build()
        return Resolved(model, entry.example_inputs(batch_size), f"zoo:{entry.name}")
    if kind == "transformers":
        return _resolve_transformers(name, batch_size, building, config or {})
    factory = load_callable(spec, "model")
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
    inputs = None
    if is_transformers_model(model):  # built from a config of the user's: the same inputs
        with contextlib.suppress(SpecError):
            inputs = default_transformers_inputs(model, batch_size)
    return Resolved(model, inputs, spec)


def resolve_inputs(spec: str) -> Any:
    """Call the ``--inputs`` SPEC; it must return a Tensor, a tuple/list or a dict."""
    import torch

    factory = load_callable(spec, "inputs")
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


def _resolve_transformers(class_name: str, batch_size: int, building: Any, overrides: dict[str, Any]) -> Resolved:
    import transformers
    from torch import nn
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
    if overrides:
        known = config.to_dict()
        unknown = sorted(key for key in overrides if key not in known)
        if unknown:
            raise SpecError(
                f"--config: {class_name}'s config has no {', '.join(map(repr, unknown))}; "
                f"its size fields are {', '.join(size_fields(config, transformers.PretrainedConfig()))}"
            )
        for key, value in overrides.items():
            expected = _expected_type(known[key], value)
            if expected:
                raise SpecError(
                    f"--config: {class_name}'s {key} takes {expected}, got {value!r} (a {type(value).__name__})"
                )
        try:
            config = config_class(**overrides)  # derived fields (head_dim) follow the overrides
        except Exception as exc:
            said = " ".join(str(exc).split())  # one line, whatever the config's own message
            raise SpecError(f"--config: {class_name}'s config refused {overrides}: {type(exc).__name__}: {said}") from None
    with building:
        model = cls(config)  # random weights from the default config: nothing is downloaded
    return Resolved(model, default_transformers_inputs(model, batch_size), f"transformers:{class_name}")


def is_transformers_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``transformers`` model (it has a config and names its main
    input), without importing transformers."""
    return hasattr(model, "config") and isinstance(getattr(model, "main_input_name", None), str)


def default_transformers_inputs(model: nn.Module, batch_size: int, seq_len: int = 128) -> dict[str, Any]:
    """The inputs a transformers model needs, built from its config (random, seeded):

    - its ``main_input_name``: ``input_ids`` below the text config's vocabulary, at most
      ``seq_len`` long and no longer than its positions allow, or ``pixel_values`` of the
      vision config's image size;
    - ``decoder_input_ids`` for an encoder-decoder (``config.is_encoder_decoder``: T5,
      BART, Whisper, ...) whose forward takes them: T5 cannot run without them;
    - both ``input_ids`` and ``pixel_values`` for a model with a text and a vision
      config whose forward takes both (CLIP, SigLIP, BLIP-2): it encodes each. Models
      that splice image features into the text at image tokens (the config names an
      ``image_token_id``: LLaVA and kin) get text alone, since their ids would have to
      hold exactly as many image tokens as the image makes.

    Anything else raises :class:`SpecError` naming what forward takes.
    """
    import torch

    config = model.config  # type: ignore[attr-defined]
    generator = torch.Generator().manual_seed(0)
    inputs: dict[str, Any] = {}
    for name in default_input_names(model):
        if name == "pixel_values":
            vision = _vision_config(config)
            channels = int(getattr(vision, "num_channels", 3))
            size = getattr(vision, "image_size", 224)
            height, width = (size, size) if isinstance(size, int) else tuple(size)
            inputs[name] = torch.rand((batch_size, channels, height, width), generator=generator)
            continue
        text = _text_config(config, decoder=name == "decoder_input_ids")
        vocab = vocab_size(model) if name == "input_ids" else getattr(text, "vocab_size", None)
        length = min(seq_len, int(getattr(text, "max_position_embeddings", seq_len) or seq_len))
        inputs[name] = torch.randint(0, int(vocab or DEFAULT_INT_LIMIT), (batch_size, length), generator=generator)
    return inputs


def default_input_names(model: nn.Module) -> list[str]:
    """The names :func:`default_transformers_inputs` builds, main input first."""
    config = model.config  # type: ignore[attr-defined]
    main = getattr(model, "main_input_name", "input_ids")
    takes = _forward_parameters(model)
    if main not in ("input_ids", "pixel_values"):
        raise SpecError(
            f"no default input for {type(model).__name__} (its main input is {main!r}; forward takes "
            f"{', '.join(takes[:6]) or 'nothing named'}{', ...' if len(takes) > 6 else ''}); "
            "pass --inputs SPEC naming a callable that returns them as a dict"
        )
    names = [main]
    dual = hasattr(config, "vision_config") and hasattr(config, "text_config") and not _names_image_token(config)
    if dual and {"input_ids", "pixel_values"} <= set(takes):
        names += [name for name in ("input_ids", "pixel_values") if name != main]
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in takes:
        names.append("decoder_input_ids")
    return names


def _forward_parameters(model: nn.Module) -> list[str]:
    """The names ``model.forward`` takes (``**kwargs`` excluded)."""
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _names_image_token(config: Any) -> bool:
    return any(getattr(config, key, None) is not None for key in ("image_token_id", "image_token_index"))


def _text_config(config: Any, *, decoder: bool = False) -> Any:
    """The config that describes a model's text (token ids): a multimodal model's text
    config, an encoder-decoder's decoder's with ``decoder``, else the config itself."""
    get = getattr(config, "get_text_config", None)
    if callable(get):
        with contextlib.suppress(TypeError, ValueError):
            return get(decoder=True) if decoder else get()
    return config


def _vision_config(config: Any) -> Any:
    """The config that describes a model's images: its vision config, an image encoder's
    (VisionEncoderDecoder), else the config itself."""
    for candidate in (getattr(config, "vision_config", None), getattr(config, "encoder", None)):
        if candidate is not None and hasattr(candidate, "image_size"):
            return candidate
    return config


def input_hint(model: nn.Module, inputs: Any) -> str | None:
    """For a transformers model that raised: one line naming what it was given and what
    its forward takes, or None for other models (their error speaks for itself)."""
    if not is_transformers_model(model):
        return None
    from layerscope.capture.inputs import describe_value, split_inputs

    args, kwargs = split_inputs(inputs)
    given = ", ".join([describe_value(a) for a in args] + [f"{k}={describe_value(v)}" for k, v in kwargs.items()])
    takes = _forward_parameters(model)
    hint = (
        f"{type(model).__name__}.forward takes {', '.join(takes[:6])}{', ...' if len(takes) > 6 else ''}; "
        f"it was given ({given or 'nothing'})"
    )
    with contextlib.suppress(SpecError):
        names = default_input_names(model)
        if args or list(kwargs) != names:
            hint += f"; without --input/--inputs layerscope builds {', '.join(names)}"
    return hint + "; pass --inputs SPEC naming a callable that returns what it needs as a dict"


#: A transformers model's class name ends -> the labels its own loss takes, made from
#: its inputs: the next-token and masked-token heads' targets are the input ids (the
#: model shifts them itself); a sequence's or image's class is 0, a token's class 0.
_LABELS_OF: tuple[tuple[str, str], ...] = (
    ("ForCausalLM", "ids"), ("LMHeadModel", "ids"), ("ForMaskedLM", "ids"), ("ForConditionalGeneration", "ids"),
    ("ForSequenceClassification", "class"), ("ForImageClassification", "class"), ("ForTokenClassification", "tokens"),
)


def training_labels(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The ``labels`` a transformers model computes its own training loss from, made
    from its keyword inputs (``kwargs``): the input ids for a language-model head (the
    decoder's, for an encoder-decoder), class 0 for a classifier (per sequence, image
    or token). None for a model that takes no ``labels`` or whose head is none of
    these: its loss is then a named one."""
    import torch

    if not is_transformers_model(model) or "labels" not in _forward_parameters(model) or "labels" in kwargs:
        return None
    name = type(model).__name__
    kind = next((kind for end, kind in _LABELS_OF if name.endswith(end)), None)
    ids = kwargs.get("decoder_input_ids", kwargs.get("input_ids"))
    if kind == "ids" and isinstance(ids, torch.Tensor):
        return {"labels": ids.clone()}
    main = kwargs.get(getattr(model, "main_input_name", "input_ids"))
    if kind == "class" and isinstance(main, torch.Tensor):
        return {"labels": torch.zeros(main.shape[0], dtype=torch.long, device=main.device)}
    if kind == "tokens" and isinstance(ids, torch.Tensor):
        return {"labels": torch.zeros_like(ids)}
    return None
