"""The component schemas of the NDJSON import and export (``handlers.imports``, ``handlers.exports``)."""

from __future__ import annotations

from handlers.ndjson_lines import MAX_REFUSALS_LISTED
from handlers.openapi.parts import Json, closed

_COUNT = {"type": "integer", "minimum": 0}


def import_schemas() -> Json:
    return {
        "NdjsonDocuments": {
            "type": "string",
            "description": "Newline-delimited JSON: one document (a JSON object) per line, or with `with_ids=1`"
            ' `{"id":"<id>","doc":<document>}` per line. Blank lines are skipped.',
        },
        "ImportReport": closed(
            {
                "complete": {"type": "boolean", "description": "The whole body was read."},
                "written": {**_COUNT, "description": "Documents written: `created` + `replaced`."},
                "created": _COUNT,
                "replaced": _COUNT,
                "refused": {**_COUNT, "description": "Lines refused (the first ones are listed in `refusals`)."},
                "skipped": {
                    **_COUNT,
                    "description": "Lines skipped: before `from_line`, or written before.",
                },
                "resumed_after": {**_COUNT, "description": "The line this import went on after (0: from the start)."},
                "last_line": {**_COUNT, "description": "The last line read and carried out (blank ones counted)."},
                "refusals": {
                    "type": "array",
                    "maxItems": MAX_REFUSALS_LISTED,
                    "description": "The first refused lines: `line` (from 1) and its problem's members.",
                    "items": {
                        "type": "object",
                        "description": "A refused line: its number and its problem's members (`errors` too for a"
                        " schema violation).",
                        "properties": {
                            "line": {"type": "integer", "minimum": 1},
                            "type": {"type": "string"},
                            "title": {"type": "string"},
                            "status": {"type": "integer"},
                            "detail": {"type": "string"},
                        },
                        "required": ["line", "type", "status", "detail"],
                    },
                },
                "refusals_listed": _COUNT,
            },
            [
                "complete",
                "written",
                "created",
                "replaced",
                "refused",
                "skipped",
                "resumed_after",
                "last_line",
                "refusals",
                "refusals_listed",
            ],
            "What an import did.",
        ),
    }
