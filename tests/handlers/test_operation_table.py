"""handlers.operations: the operation table's paths become Cyclone's routes, each in one place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from handlers import paths
from handlers.operation import Resource, routes
from handlers.operations import OPERATIONS

ROOT = Path(__file__).resolve().parents[2]

# The routes api/app.py wrote by hand before the table (467c5a9), in Cyclone's order.
ROUTES_BEFORE = [
    r"/v1/_get/([^/]+)",
    r"/v1/_changes/([^/]+)/tickets",
    r"/v1/_changes/([^/]+)",
    r"/v1/_batch",
    r"/v1/_import/([^/]+)",  # added since (the NDJSON import), before the document path it would match
    r"/v1/_collections/([^/]+)",
    r"/v1/_collections/?",
    r"/v1/([^/]+)/([^/]+)",
    r"/v1/([^/]+)/?",
    r"/healthz",
    r"/readyz",
    r"/metrics",
    r"/openapi\.json",
    r"/docs/?",
    r"/docs/assets/([^/]+)",
]


def test_the_derived_routes_are_the_hand_written_ones_in_their_order():
    assert [route.pattern for route in routes(OPERATIONS, {})] == ROUTES_BEFORE


def test_without_docs_the_docs_routes_are_left_out():
    assert [route.pattern for route in routes(OPERATIONS, {}, with_docs=False)] == ROUTES_BEFORE[:-2]


def test_each_route_gets_its_handlers_dependencies():
    handler = OPERATIONS[0].resource.handler
    given = {"x": 1}
    first = routes(OPERATIONS, {handler: given})[0]
    assert (first.pattern, first.handler_class) == (ROUTES_BEFORE[0], handler)
    assert first.kwargs == {**given, "operations": {"POST": OPERATIONS[0]}, "methods": ("POST", "OPTIONS")}


def test_each_route_knows_its_operations_and_its_handler_answers_just_those():
    for route in routes(OPERATIONS, {}):
        declared = {operation.method for operation in OPERATIONS if operation.resource.handler is route.handler_class}
        heads = {
            "HEAD" for operation in OPERATIONS if operation.resource.handler is route.handler_class and operation.head
        }
        assert set(route.operations) == declared | heads, route.pattern
        assert "SUPPORTED_METHODS" not in vars(route.handler_class), route.pattern  # the table's, not the handler's
        with_kwargs = routes(OPERATIONS, {route.handler_class: {}})
        methods = next(r.kwargs["methods"] for r in with_kwargs if r.pattern == route.pattern)
        assert set(methods) == declared | heads | {"OPTIONS"}, route.pattern


def test_no_handler_decides_admission_nor_the_connection_a_path():
    """Admission is the base handler's, by the operation's declared scope; body limits come from the table."""
    root = Path(__file__).resolve().parents[2]
    by_method = [
        str(path.relative_to(root))
        for path in sorted((root / "handlers").rglob("*.py"))
        if "def writes(self)" in path.read_text() or "self.writes()" in path.read_text()
    ]
    connection = ("connection.py", "streamed_body.py", "routed.py", "application.py")
    by_path = [name for name in connection if "handlers.paths" in (root / "api" / name).read_text()]
    assert (by_method, by_path) == ([], [])


@pytest.mark.parametrize(
    ("template", "slash", "pattern"),
    [("/a.b/{x}", False, r"/a\.b/([^/]+)"), ("/a-b/{x}/c", True, r"/a\-b/([^/]+)/c/?"), ("/a+b", False, r"/a\+b")],
)
def test_a_template_becomes_a_regex_with_loose_segments_and_literal_text(template, slash, pattern):
    resource = Resource(template, object, "", "", slash=slash)
    assert resource.pattern == pattern
    assert re.fullmatch(pattern, template.replace("{x}", "a b%")) is not None


def test_each_operation_is_declared_once():
    keys = [(op.method, op.path) for op in OPERATIONS]
    assert len(keys) == len(set(keys))
    ids = [op.operation_id for op in OPERATIONS] + [op.head for op in OPERATIONS if op.head]
    assert len(ids) == len(set(ids))


def test_scopes_are_the_known_ones_and_only_operational_paths_need_no_token():
    assert {op.scope for op in OPERATIONS} <= {None, "token", "read", "write", "admin"}
    for op in OPERATIONS:
        assert (op.scope is None) == (not op.path.startswith("/v1/")), op.operation_id


def test_no_path_template_is_written_outside_handlers_paths():
    """Each template is a string literal in one module: api/, handlers/ and cache/ import it from there."""
    templates = {value for name, value in vars(paths).items() if name.isupper()}
    found = []
    for module in [*ROOT.glob("api/**/*.py"), *ROOT.glob("handlers/**/*.py"), *ROOT.glob("cache/**/*.py")]:
        if module == ROOT / "handlers" / "paths.py":
            continue
        for literal in re.findall(r"""["'](/[^"'\s]*)["']""", module.read_text()):
            if literal in templates:
                found.append(f"{module.relative_to(ROOT)}: {literal}")
    assert found == []


def test_the_document_routes_pipelines_are_the_tables_bound_to_its_answers():
    """The read's and replace's pipelines come from the table, not from the handler or the connection."""

    class Answers:
        def read(self) -> None: ...

        def replace(self) -> None: ...

    answers = Answers()
    document = next(op.resource for op in OPERATIONS if op.operation_id == "getDocument")
    routed = {
        route.handler_class: route.kwargs for route in routes(OPERATIONS, {document.handler: {"answers": answers}})
    }
    pipelines = routed[document.handler]["pipelines"]
    assert pipelines == {"GET": answers.read, "HEAD": answers.read, "PUT": answers.replace}


def _query_parameters(spec, operation_id: str) -> set:
    """The ``in: query`` parameters of an operation of the generated document (its security's ticket too)."""
    for item in spec["paths"].values():
        for operation in item.values():
            if isinstance(operation, dict) and operation.get("operationId") == operation_id:
                named = []
                for parameter in [*item.get("parameters", []), *operation.get("parameters", [])]:
                    if "$ref" in parameter:
                        parameter = spec["components"]["parameters"][parameter["$ref"].rsplit("/", 1)[1]]
                    named.append(parameter)
                schemes = spec["components"]["securitySchemes"]
                tickets = [schemes[name] for need in operation.get("security", []) for name in need]
                return {p["name"] for p in named + tickets if p.get("in") == "query"}
    raise AssertionError(f"no operation {operation_id}")


def test_the_arguments_never_taken_for_filters_are_the_operations_own_parameters():
    """A list's or a feed's own parameters are never a query's filters (issue #59): the handlers' lists are the
    table's, so a parameter added to the table is not taken for a filter (and refused) by its handler."""
    from handlers.changes import FEED_ARGUMENTS
    from handlers.collections import LIST_ARGUMENTS
    from handlers.openapi.build import openapi_document

    spec = openapi_document(OPERATIONS, 100, True, 60)
    assert _query_parameters(spec, "listDocuments") == LIST_ARGUMENTS | {"order"}
    assert _query_parameters(spec, "getChanges") == FEED_ARGUMENTS
