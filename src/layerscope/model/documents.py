"""The strict reader of a saved ``layerscope/1`` profile: every field's type checked
(:mod:`layerscope.model.schema`) before :meth:`Profile.from_dict` builds it, and the tree's
invariants (:mod:`layerscope.model.check`) after, so a damaged or hostile file is refused with
the place it went wrong. It sits above ``model/tree.py`` because those checks read the tree;
``layerscope.load`` reads every document kind by its schema (:mod:`layerscope.loading`).
"""

from __future__ import annotations

from typing import Any

from layerscope.base.errors import SchemaError
from layerscope.model.check import summarize, tree_problems
from layerscope.model.schema import document_problems
from layerscope.model.tree import SCHEMA, Profile


def profile_from_dict(doc: Any, source: str = "document") -> Profile:
    """Rebuild a :class:`Profile` from a ``layerscope/1`` dict, checking the type of every
    field it reads and the tree's invariants."""
    if not isinstance(doc, dict) or "schema" not in doc:
        raise SchemaError(f"{source} is not a layerscope profile (no 'schema' field)")
    schema = doc["schema"]
    if schema != SCHEMA:
        raise SchemaError(
            f"{source} has schema {schema!r}; this layerscope reads {SCHEMA!r} only"
        )
    problems = document_problems(doc)
    if problems:
        raise SchemaError(f"{source} is a damaged layerscope profile: {summarize(problems)}")
    try:
        profile = Profile.from_dict(doc)
        problems = tree_problems(profile)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SchemaError(f"{source} is a damaged layerscope profile: {type(exc).__name__}: {exc}") from None
    if problems:
        raise SchemaError(f"{source} is inconsistent: {summarize(problems)}")
    return profile
