"""The ``layerscope/1`` JSON document."""

from __future__ import annotations

import json
from typing import Any

from layerscope.render import register_renderer
from layerscope.tree import Profile


@register_renderer("json", extensions=(".json",), description="the layerscope/1 JSON document")
def render_json(profile: Profile, *, indent: int | None = None, **_: Any) -> str:
    return json.dumps(profile.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False) + "\n"
