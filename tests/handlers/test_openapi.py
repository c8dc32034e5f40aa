"""The OpenAPI document is served, valid, and in step with the code.

Routes and methods are read from ``api.app.make_app``; statuses, headers,
problem types and bodies are checked against real responses of a running
Jetway, and against the errors the store's failures map to.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Optional, Set, Tuple

import jsonschema
import pytest
from openapi_spec_validator import validate

from api.app import make_app
from api.config import Settings
from cache.errors import DocumentTooLarge, RedisReplyError, RedisTimeout, RedisUnavailable, WriteConflict
from cache.json import codec
from handlers.base import as_api_error
from handlers.http import validation
from handlers.http.errors import PROBLEM_TYPE_PREFIX
from handlers.openapi.build import openapi_document
from handlers.operations import OPERATIONS
from handlers.paths import (
    BATCH,
    COLLECTION,
    DOCS,
    DOCS_ASSET,
    DOCUMENT,
    HEALTHZ,
    OPENAPI,
    READYZ,
    SETTINGS,
    SETTINGS_LIST,
)

SPEC = openapi_document(OPERATIONS)
PATHS: Dict[str, Any] = SPEC["paths"]
HTTP_METHODS = ("get", "head", "put", "patch", "delete", "post", "options", "trace")
JSON_TYPE = "application/json"
PROBLEM_TYPE = "application/problem+json"


def resolve(node: Dict[str, Any]) -> Dict[str, Any]:
    """Follow a local ``$ref`` (``#/components/...``) to what it names."""
    while "$ref" in node:
        target: Any = SPEC
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def operations(path: str) -> Dict[str, Any]:
    return {method: op for method, op in PATHS[path].items() if method in HTTP_METHODS}


def all_operations():
    return [(path, method) for path in PATHS for method in operations(path)]


def documented_problem_types() -> Set[str]:
    description = SPEC["components"]["schemas"]["Problem"]["properties"]["type"]["description"]
    return set(re.findall(r"`(urn:[^`]+)`", description))


def route_table(docs: bool = True) -> Dict[str, type]:
    """Path template -> handler class, from the app's own route table."""
    # The store and reactor are only handed to handlers; building the table never uses them.
    app = make_app(Settings(access_log=False, docs=docs), store=object(), gate=None, reactor=None)
    return {template(spec.regex.pattern): spec.handler_class for _, specs in app.handlers for spec in specs}


def template(pattern: str) -> str:
    """A route regex as an OpenAPI path template, with ``{}`` for each segment."""
    text = pattern.removesuffix("$").removesuffix("/?").replace("([^/]+)", "{}").replace(r"\.", ".")
    assert not set(text) & set("()[]*+?\\^$|"), f"route {pattern!r} needs a translation rule here"
    return text


def unnamed(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


# -- the document itself ----------------------------------------------------


def test_openapi_json_is_served_as_json_3_1(api):
    response = api.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == JSON_TYPE
    served = response.json()
    assert served["openapi"] == "3.1.0"
    assert served == json.loads(json.dumps(SPEC))


def test_document_is_valid_openapi_3_1():
    validate(SPEC)


def test_document_serializes_with_the_api_codec():
    assert codec.loads(codec.dumps(SPEC)) == json.loads(json.dumps(SPEC))


# -- routes and methods -------------------------------------------------------


def test_every_route_is_documented_and_every_documented_path_is_routed():
    assert {unnamed(path) for path in PATHS} == set(route_table())


def test_without_the_docs_neither_the_routes_nor_the_document_have_them():
    paths = openapi_document(OPERATIONS, with_docs=False)["paths"]
    assert {unnamed(path) for path in paths} == set(route_table(docs=False))
    assert DOCS not in paths and DOCS in PATHS


def table_operations(with_docs: bool = True) -> Set[Tuple[str, str]]:
    """(method, path) of every operation of the table, with the HEAD and OPTIONS the document derives."""
    declared = {(op.method.lower(), op.path) for op in OPERATIONS if with_docs or not op.resource.with_docs}
    heads = {("head", op.path) for op in OPERATIONS if op.head and (with_docs or not op.resource.with_docs)}
    return declared | heads | {("options", path) for _, path in declared}


@pytest.mark.parametrize("with_docs", [True, False])
def test_the_documents_operations_are_exactly_the_tables(with_docs):
    document = openapi_document(OPERATIONS, with_docs=with_docs)
    documented = {
        (method, path) for path, item in document["paths"].items() for method in item if method in HTTP_METHODS
    }
    assert documented == table_operations(with_docs)


def test_every_route_is_a_path_of_the_table_in_the_tables_order():
    app = make_app(Settings(access_log=False), store=object(), gate=None, reactor=None)
    routed = [spec.regex.pattern for _, specs in app.handlers for spec in specs]
    paths = list(dict.fromkeys(op.resource for op in OPERATIONS))
    assert routed == [resource.pattern + "$" for resource in paths]


def sample_url(path: str) -> str:
    return path.replace("{collection}", "users").replace("{id}", "u1").replace("{asset}", "start.js")


@pytest.mark.parametrize("method,path", sorted(table_operations()), ids=" ".join)
def test_every_operation_of_the_table_is_routed(stored, method, path):
    """No operation of the table (nor its derived HEAD or OPTIONS) is a 404 ``no-route`` or a 405."""
    url = sample_url(path)
    response = stored.request(method.upper(), url, headers={"Accept": JSON_TYPE})
    assert response.status_code != 405, (method, url)
    if response.status_code == 404:
        body = response.json() if method != "head" else stored.get(url).json()
        assert body["type"] != PROBLEM_TYPE_PREFIX + "no-route", (method, url)


def test_path_templates_name_exactly_their_path_parameters():
    for path, item in PATHS.items():
        declared = {resolve(p)["name"] for p in item.get("parameters", []) if resolve(p)["in"] == "path"}
        assert set(re.findall(r"\{([^}]+)\}", path)) == declared, path


def test_documented_operations_are_the_methods_each_route_answers():
    """What Cyclone answers (its 405, the Allow header) is the route's ``methods``, from the same table."""
    app = make_app(Settings(access_log=False, docs=True), store=object(), gate=None, reactor=None)
    answered = {
        template(spec.regex.pattern): spec.kwargs.get("methods", spec.handler_class.SUPPORTED_METHODS)
        for _, specs in app.handlers
        for spec in specs
    }
    for path in PATHS:
        assert set(operations(path)) == {method.lower() for method in answered[unnamed(path)]}, path


def test_path_parameter_patterns_agree_with_validation():
    samples = ["a", "users", "Users", "1abc", "a" * 64, "a" * 65, "a-b_c", "a.b", "", "ab\n", ".", "..", "x~y", "a/b"]
    samples += ["x" * 128, "x" * 129, "é"]
    for name, check in [("CollectionName", validation.collection_name), ("DocumentId", validation.document_id)]:
        schema = SPEC["components"]["schemas"][name]
        for text in samples:
            assert schema_accepts(schema, text) == is_valid(check, text), (name, text)


def schema_accepts(schema: Dict[str, Any], text: str) -> bool:
    """With ECMA-262 anchors: jsonschema uses ``re.search``, whose ``$`` also matches before a final newline."""
    pattern = schema["pattern"]
    assert pattern.startswith("^") and pattern.endswith("$")
    rest = {key: value for key, value in schema.items() if key != "pattern"}
    return re.fullmatch(pattern[1:-1], text) is not None and jsonschema.Draft202012Validator(rest).is_valid(text)


def is_valid(check, text: str) -> bool:
    try:
        check(text)
    except Exception:
        return False
    return True


def test_query_limits_are_the_validation_constants():
    parameters = SPEC["components"]["parameters"]
    assert parameters["limit"]["schema"]["maximum"] == validation.MAX_LIMIT
    # Stated in words, never as a schema default: generated clients send a default with every call.
    assert "default" not in parameters["limit"]["schema"]
    assert f"{validation.DEFAULT_LIMIT} when absent" in parameters["limit"]["description"]
    assert parameters["ttl"]["schema"]["maximum"] == validation.MAX_TTL
    assert parameters["ids"]["schema"]["maxItems"] == validation.MAX_IDS


def test_no_parameter_declares_a_default():
    """Generated clients send a declared default with every call, where it may conflict (``limit`` with ``ids``)."""
    defaults = [
        name for name, parameter in SPEC["components"]["parameters"].items() if "default" in parameter["schema"]
    ]
    assert defaults == []


# -- statuses, statically -----------------------------------------------------


@pytest.mark.parametrize(
    "path,method", [pm for pm in all_operations() if pm[0].startswith("/v1/") and pm[1] != "options"]
)
def test_v1_operations_document_bad_requests_and_redis_failures(path, method):
    responses = operations(path)[method]["responses"]
    assert {"400", "500", "502", "503", "504"} <= set(responses)
    assert "Retry-After" in responses["503"]["headers"]


@pytest.mark.parametrize(
    "path,method,statuses",
    [
        (DOCUMENT, "get", {"200", "304", "404"}),
        (DOCUMENT, "head", {"200", "304", "404"}),
        (DOCUMENT, "put", {"200", "201", "412", "413", "415"}),
        (DOCUMENT, "patch", {"200", "404", "409", "412", "413", "415", "422"}),
        (DOCUMENT, "delete", {"204", "404", "412"}),
        (COLLECTION, "get", {"200"}),
        (COLLECTION, "post", {"201", "413", "415"}),
        (READYZ, "get", {"200", "503"}),
    ],
)
def test_operation_documents_its_own_statuses(path, method, statuses):
    assert statuses <= set(operations(path)[method]["responses"])


def test_errors_are_problem_json_and_head_responses_have_no_body():
    for path, method in all_operations():
        for status, response in operations(path)[method]["responses"].items():
            if method == "head":
                assert "content" not in response, (path, method, status)
            elif status.startswith(("4", "5")):
                assert response["content"][PROBLEM_TYPE]["schema"] == {"$ref": "#/components/schemas/Problem"}


def test_405_is_documented_with_allow_for_every_path():
    response = SPEC["components"]["responses"]["MethodNotAllowed"]
    assert "Allow" in response["headers"]
    for path, item in PATHS.items():
        assert "405" in item["description"], path


@pytest.mark.parametrize(
    "failure", [RedisUnavailable(), RedisTimeout(), RedisReplyError(), WriteConflict(), DocumentTooLarge(9)]
)
def test_store_failures_map_to_documented_problem_types(failure):
    error = as_api_error(failure)
    assert PROBLEM_TYPE_PREFIX + error.problem in documented_problem_types()
    assert str(error.status_code) in operations(DOCUMENT)["patch"]["responses"]


def test_unserializable_merge_maps_to_documented_problem_type():
    error = as_api_error(codec.JsonError("x"))
    assert error.status_code == 422
    assert PROBLEM_TYPE_PREFIX + error.problem in documented_problem_types()


# -- statuses, headers and bodies of real responses ---------------------------

BIG = b"{" + b" " * (1024 * 1024) + b"}"
MERGE = {"Content-Type": "application/merge-patch+json"}
TEXT = {"Content-Type": "text/plain"}
JSON_HEADERS = {"Content-Type": JSON_TYPE}
STALE = {"If-Match": '"stale"'}
# Every kind of operation and of result: documents, an id alone, problems.
BATCH_BODY = json.dumps(
    {
        "operations": [
            {"op": "get", "collection": "users", "id": "u1"},
            {"op": "get", "collection": "users", "id": "nope"},
            {"op": "put", "collection": "users", "id": "b1", "document": {"a": 1}, "ttl": 60},
            {"op": "create", "collection": "users", "document": {"b": 2}},
            {"op": "patch", "collection": "users", "id": "b1", "patch": {"c": 3}, "if_match": "*"},
            {"op": "delete", "collection": "users", "id": "b1"},
            {"op": "put", "collection": "Users", "id": "x", "document": {}},
        ]
    }
).encode()
TOO_MANY = json.dumps({"operations": [{"op": "get", "collection": "users", "id": "u1"}] * 1001}).encode()

CASES = [
    # (method, url, body, headers, status, documented path)
    ("GET", "/healthz", None, {}, 200, HEALTHZ),
    ("HEAD", "/healthz", None, {}, 200, HEALTHZ),
    ("GET", "/readyz", None, {}, 200, READYZ),
    ("HEAD", "/openapi.json", None, {}, 200, OPENAPI),
    ("HEAD", "/docs", None, {}, 200, DOCS),
    ("GET", "/docs", None, {"If-None-Match": "*"}, 304, DOCS),
    ("HEAD", "/docs/assets/start.js", None, {}, 200, DOCS_ASSET),
    ("GET", "/docs/assets/start.js", None, {"If-None-Match": "*"}, 304, DOCS_ASSET),
    ("GET", "/docs/assets/nope.js", None, {}, 404, DOCS_ASSET),
    ("GET", "/v1/users/u1", None, {}, 200, DOCUMENT),
    ("HEAD", "/v1/users/u1", None, {}, 200, DOCUMENT),
    ("GET", "/v1/users/u1", None, {"If-None-Match": "*"}, 304, DOCUMENT),
    ("HEAD", "/v1/users/u1", None, {"If-None-Match": "*"}, 304, DOCUMENT),
    ("GET", "/v1/Users/u1", None, {}, 400, DOCUMENT),
    ("GET", "/v1/users/" + "x" * 129, None, {}, 400, DOCUMENT),
    ("GET", "/v1/users/nope", None, {}, 404, DOCUMENT),
    ("HEAD", "/v1/users/nope", None, {}, 404, DOCUMENT),
    ("PUT", "/v1/users/u2", b"{}", JSON_HEADERS, 201, DOCUMENT),
    ("PUT", "/v1/users/u1?ttl=60", b"{}", JSON_HEADERS, 200, DOCUMENT),
    ("PUT", "/v1/users/u1?ttl=0", b"{}", JSON_HEADERS, 400, DOCUMENT),
    ("PUT", "/v1/users/u1", b"{", JSON_HEADERS, 400, DOCUMENT),
    ("PUT", "/v1/users/u1", b"[]", JSON_HEADERS, 400, DOCUMENT),
    ("PUT", "/v1/users/u1", b"{}", TEXT, 415, DOCUMENT),
    ("PUT", "/v1/users/u1", BIG, JSON_HEADERS, 413, DOCUMENT),
    ("PUT", "/v1/users/u1", b"{}", {**JSON_HEADERS, "If-None-Match": "*"}, 412, DOCUMENT),
    ("PUT", "/v1/users/u1", b"{}", {**JSON_HEADERS, **STALE}, 412, DOCUMENT),
    ("PATCH", "/v1/users/u1", b'{"b":2}', MERGE, 200, DOCUMENT),
    ("PATCH", "/v1/users/u1", b'{"b":2}', JSON_HEADERS, 415, DOCUMENT),
    ("PATCH", "/v1/users/u1", b"null", MERGE, 400, DOCUMENT),
    ("PATCH", "/v1/users/nope", b"{}", MERGE, 404, DOCUMENT),
    ("PATCH", "/v1/users/u1", b"{}", {**MERGE, **STALE}, 412, DOCUMENT),
    ("PATCH", "/v1/users/u1", BIG, MERGE, 413, DOCUMENT),
    ("PUT", "/v1/users/huge", b'{"n":1e400}', JSON_HEADERS, 400, DOCUMENT),
    ("DELETE", "/v1/users/u1", None, {}, 204, DOCUMENT),
    ("DELETE", "/v1/users/nope", None, {}, 404, DOCUMENT),
    ("DELETE", "/v1/users/u1", None, STALE, 412, DOCUMENT),
    ("GET", "/v1/users", None, {}, 200, COLLECTION),
    ("GET", "/v1/users/?limit=1", None, {}, 200, COLLECTION),
    ("HEAD", "/v1/users?limit=1", None, {}, 200, COLLECTION),
    ("GET", "/v1/users?ids=u1,nope", None, {}, 200, COLLECTION),
    ("GET", "/v1/users?limit=1", None, {"Prefer": "count=exact"}, 200, COLLECTION),
    ("GET", "/v1/users", None, {"Prefer": "handling=strict, count=planned"}, 400, COLLECTION),
    ("GET", "/v1/users?with_ids=1", None, {"Accept": "application/x-ndjson"}, 200, COLLECTION),
    ("GET", "/v1/users?with_ids=2", None, {"Accept": "application/x-ndjson"}, 400, COLLECTION),
    ("GET", "/v1/users?limit=0", None, {}, 400, COLLECTION),
    ("GET", "/v1/users?limit=1&limit=2", None, {}, 400, COLLECTION),
    ("GET", "/v1/users?cursor=%21", None, {}, 400, COLLECTION),
    ("GET", "/v1/users?ids=u1,u2&limit=1", None, {}, 400, COLLECTION),
    ("GET", "/v1/users?ids=" + ",".join(["a"] * (validation.MAX_IDS + 1)), None, {}, 400, COLLECTION),
    ("POST", "/v1/users", b'{"a":1}', JSON_HEADERS, 201, COLLECTION),
    ("POST", "/v1/users?ttl=x", b"{}", JSON_HEADERS, 400, COLLECTION),
    ("POST", "/v1/users", b"{}", TEXT, 415, COLLECTION),
    ("POST", "/v1/users", BIG, JSON_HEADERS, 413, COLLECTION),
    ("POST", "/v1/_batch", BATCH_BODY, JSON_HEADERS, 200, BATCH),
    ("POST", "/v1/_batch", b'{"operations":[]}', JSON_HEADERS, 400, BATCH),
    ("POST", "/v1/_batch", b'{"operations":[{"op":"get"}]}', TEXT, 415, BATCH),
    ("POST", "/v1/_batch", TOO_MANY, JSON_HEADERS, 413, BATCH),
    ("GET", "/v1/_collections", None, {}, 200, SETTINGS_LIST),
    ("HEAD", "/v1/_collections/", None, {}, 200, SETTINGS_LIST),
    ("GET", "/v1/_collections/users", None, {}, 404, SETTINGS),
    ("GET", "/v1/_collections/Users", None, {}, 400, SETTINGS),
    ("PUT", "/v1/_collections/users", b'{"ttl":60}', JSON_HEADERS, 201, SETTINGS),
    ("PUT", "/v1/_collections/users", b'{"ttl":60}', TEXT, 415, SETTINGS),
    ("PUT", "/v1/_collections/users", b'{"ttl":60}', {**JSON_HEADERS, **STALE}, 412, SETTINGS),
    ("PUT", "/v1/_collections/users", b'{"schema":{"type":"nope"}}', JSON_HEADERS, 422, SETTINGS),
    ("PUT", "/v1/_collections/users", b'{"bogus":1}', JSON_HEADERS, 422, SETTINGS),
    ("DELETE", "/v1/_collections/users", None, {}, 404, SETTINGS),
]


@pytest.fixture
def stored(api):
    """``users/u1``."""
    assert api.put_json("/v1/users/u1", b'{"a":1}').status_code == 201
    return api


@pytest.mark.parametrize(
    "method,url,body,headers,status,path", CASES, ids=[f"{c[0]} {c[1][:40]} {c[4]}" for c in CASES]
)
def test_real_responses_match_their_documentation(stored, method, url, body, headers, status, path):
    response = stored.request(method, url, data=body, headers=headers)
    assert response.status_code == status, response.text
    documented = operations(path)[method.lower()]["responses"].get(str(status))
    assert documented is not None, f"{method} {path} does not document {status}"
    for name, header in documented.get("headers", {}).items():
        if resolve(header)["required"]:
            assert name in response.headers, f"{method} {url} {status} lacks documented {name}"
    check_body(response, documented)


def check_body(response, documented: Dict[str, Any]) -> None:
    content: Optional[Dict[str, Any]] = documented.get("content")
    if content is None:
        assert response.content == b""
        return
    media_type = response.headers["Content-Type"]
    assert media_type in content, f"{media_type} is not among {list(content)}"
    if media_type == "application/x-ndjson":  # a string schema: each line a JSON object
        assert all(isinstance(json.loads(line), dict) for line in response.content.splitlines())
        return
    schema = {**content[media_type]["schema"], "components": SPEC["components"]}
    body = response.json()
    jsonschema.Draft202012Validator(schema).validate(body)
    if media_type == PROBLEM_TYPE:
        assert body["status"] == response.status_code
        assert body["type"] in documented_problem_types()


STRICT_SCHEMA = b'{"schema":{"type":"object","required":["email"],"properties":{"email":{"format":"email"}}}}'


@pytest.mark.parametrize(
    "method,url,body,headers,path",
    [
        ("PUT", "/v1/strict/s1", b'{"email":"nope"}', JSON_HEADERS, DOCUMENT),
        ("POST", "/v1/strict", b"{}", JSON_HEADERS, COLLECTION),
        ("PATCH", "/v1/strict/ok", b'{"email":null}', MERGE, DOCUMENT),
    ],
)
def test_schema_violations_match_their_documentation(api, method, url, body, headers, path):
    assert api.put_json("/v1/_collections/strict", STRICT_SCHEMA).status_code == 201
    assert api.put_json("/v1/strict/ok", b'{"email":"a@example.com"}').status_code == 201
    response = api.request(method, url, data=body, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["type"] == PROBLEM_TYPE_PREFIX + "schema-violation"
    assert response.json()["errors"], response.text
    check_body(response, operations(path)[method.lower()]["responses"]["422"])


def test_settings_routes_are_documented_with_the_admin_scope():
    for path in (SETTINGS, SETTINGS_LIST):
        for method, operation in operations(path).items():
            if method != "options":  # a preflight needs no token
                assert "admin" in operation["responses"]["403"]["description"]


@pytest.mark.parametrize("path", list(PATHS))
def test_undocumented_methods_are_405_with_allow_listing_the_documented_ones(api, path):
    url = path.replace("{collection}", "users").replace("{id}", "u1")
    documented = operations(path)
    method = next(m for m in ("put", "post", "delete", "patch", "options") if m not in documented)
    response = api.request(method.upper(), url)
    assert response.status_code == 405
    assert {m.strip().lower() for m in response.headers["Allow"].split(",")} == set(documented)
    problem = SPEC["components"]["responses"]["MethodNotAllowed"]
    check_body(response, problem)


def test_unknown_path_is_a_documented_problem_type(api):
    response = api.get("/v2/nowhere")
    assert response.status_code == 404
    assert response.json()["type"] in documented_problem_types()


def test_a_count_is_documented_where_it_is_asked_and_answered(stored):
    """``Prefer`` (its count) on a list page or a query, ``Content-Range`` and ``Preference-Applied`` on its 200,
    the header's pattern what a real counted page sends."""
    listing = operations(COLLECTION)["get"]
    prefer = [resolve(p) for p in listing["parameters"] if resolve(p)["name"] == "Prefer"]
    assert len(prefer) == 1 and prefer[0]["in"] == "header" and "count=exact" in prefer[0]["description"]
    answered = listing["responses"]["200"]["headers"]
    assert not resolve(answered["Content-Range"])["required"] and "Preference-Applied" in answered
    response = stored.get("/v1/users?limit=1", headers={"Prefer": "count=exact"})
    assert response.headers["Preference-Applied"] == "count=exact"
    assert re.fullmatch(resolve(answered["Content-Range"])["schema"]["pattern"], response.headers["Content-Range"])
    assert response.headers["Content-Range"] == "0-0/1"
