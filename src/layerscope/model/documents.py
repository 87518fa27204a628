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
from layerscope.model.diff import DIFF_SCHEMA, ProfileDiff, diff
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


def diff_from_dict(doc: Any, source: str = "document") -> ProfileDiff:
    """Rebuild a saved :class:`~layerscope.model.diff.ProfileDiff` (a
    ``layerscope-diff/1`` dict) from the two profiles it holds, each read as
    :func:`profile_from_dict` reads one, compared with the diff's own metric and noise
    floor: the rows and summary are derived again, never trusted from the file."""
    if not isinstance(doc, dict) or doc.get("schema") != DIFF_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise SchemaError(f"{source} is not a layerscope diff: expected schema {DIFF_SCHEMA!r}, found {found!r}")
    profiles = doc.get("profiles")
    if not isinstance(profiles, dict) or not {"base", "new"} <= profiles.keys():
        raise SchemaError(
            f"{source} is a diff saved without its two profiles ('profiles': base and new); "
            "run layerscope diff on the two profiles again"
        )
    metric, floor = doc.get("metric"), doc.get("min_time_ns")
    if not isinstance(metric, str) or not (isinstance(floor, int) and not isinstance(floor, bool)):
        raise SchemaError(f"{source} is a damaged layerscope diff: 'metric' must be a name and 'min_time_ns' an integer")
    base = profile_from_dict(profiles["base"], f"{source} (its base profile)")
    new = profile_from_dict(profiles["new"], f"{source} (its new profile)")
    try:
        return diff(base, new, min_time_ns=floor, metric=metric)
    except ValueError as exc:
        raise SchemaError(f"{source} is a damaged layerscope diff: {exc}") from None
