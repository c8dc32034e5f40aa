"""JSON Merge Patch (RFC 7396) on parsed JSON values."""

from __future__ import annotations

from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply ``patch`` to ``target`` as RFC 7396 section 2 describes.

    ``target`` is not modified; the result shares unchanged sub-values.
    """
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = merge_patch(result.get(name), value)
    return result
