"""The ``layerscope/1`` JSON document."""

from __future__ import annotations

import json

from layerscope.base.formats import register_renderer
from layerscope.model.tree import Profile
from layerscope.render.options import INDENT


@register_renderer("json", extensions=(".json",), description="the layerscope/1 JSON document", options=(INDENT,))
def render_json(profile: Profile, *, indent: int | None = None) -> str:
    return json.dumps(profile.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False) + "\n"
