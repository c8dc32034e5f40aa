"""The OpenAPI 3.1 document, generated from the operation table it is given.

Each operation of ``handlers.operations`` becomes a method of its path, with
the shared error responses its ``errors`` name; what every path has besides
is derived here: a ``HEAD`` beside each ``GET`` that declares one (the same
answers, no bodies), an ``OPTIONS``, and the statuses the connection answers
before any handler runs (the front door). The components come from the
sibling modules. The table is an argument, never imported: it imports the
handler that serves this document.
"""

from __future__ import annotations

import copy
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from handlers.base import PROBLEM_TYPE
from handlers.http import validation
from handlers.openapi.components import headers, parameters, security_schemes
from handlers.openapi.parts import Json, ref, refs
from handlers.openapi.problems import ERROR_HEADERS, ERRORS, FRONT_DOOR, MALFORMED, NOT_REPLICATED
from handlers.openapi.schemas import schemas
from handlers.operation import Operation, Resource, Response

_INFO = {
    "title": "Jetway",
    "version": "1",
    "description": "A JSON REST gateway to Redis. Errors are `application/problem+json` "
    "(see the Problem schema); an unknown path is a 404 (`no-route`).",
}


def openapi_document(
    operations: Sequence[Operation], max_ids: int = validation.MAX_IDS, with_docs: bool = True, max_wait: int = 60
) -> Json:
    """The whole document, as plain JSON values; ``with_docs`` false leaves out the /docs paths."""
    paths = {
        resource.template: path_item(resource, declared)
        for resource, declared in by_resource(operations)
        if with_docs or not resource.with_docs
    }
    return {
        "openapi": "3.1.0",
        "info": _INFO,
        "paths": paths,
        "components": {
            "schemas": schemas(max_ids),
            "parameters": parameters(max_ids, max_wait),
            "headers": headers(),
            "responses": {"MethodNotAllowed": errors((405,))["405"]},
            "securitySchemes": security_schemes(),
        },
    }


def by_resource(operations: Iterable[Operation]) -> List[Tuple[Resource, List[Operation]]]:
    """The operations grouped by path, in the order each path first appears."""
    grouped: Dict[Resource, List[Operation]] = {}
    for operation in operations:
        grouped.setdefault(operation.resource, []).append(operation)
    return list(grouped.items())


def path_item(resource: Resource, declared: Sequence[Operation]) -> Json:
    """A path: its operations (with derived HEAD and OPTIONS), and the connection's own statuses on each."""
    item: Json = {
        "description": resource.description + " Any other method is a 405 with `Allow` (see MethodNotAllowed)."
    }
    if resource.parameters:
        item["parameters"] = refs("parameters", resource.parameters)
    methods: Json = {}
    for operation in declared:
        methods[operation.method.lower()] = operation_object(operation)
        if operation.head is not None:
            methods["head"] = _head_of(methods["get"], operation.head)
    methods["options"] = _options(resource.name, [method.upper() for method in methods])
    front_door = {status: errors((status,), {400: MALFORMED})[str(status)] for status in FRONT_DOOR}
    for method, operation_json in methods.items():
        for status, answer in front_door.items():
            if method == "head":
                answer = {key: value for key, value in answer.items() if key != "content"}
            operation_json["responses"].setdefault(str(status), answer)
    return {**item, **methods}


def operation_object(operation: Operation) -> Json:
    answers = {str(status): response(answer) for status, answer in operation.responses.items()}
    answers.update(errors(operation.errors, operation.details))
    if operation.replicated is not None:
        description = ERRORS[503] + NOT_REPLICATED
        answers["503"] = response(
            Response(description, "Problem", ("Retry-After", *operation.replicated), PROBLEM_TYPE)
        )
    built: Json = {"operationId": operation.operation_id, "summary": operation.summary, "tags": [operation.tag]}
    if operation.parameters:
        built["parameters"] = [ref("parameters", p) if isinstance(p, str) else p for p in operation.parameters]
    if operation.body is not None:
        body = operation.body
        schema = {"schema": ref("schemas", body.schema)}
        built["requestBody"] = {"required": True, "description": body.description, "content": {body.media: schema}}
    built["responses"] = answers
    if operation.scope is not None:
        built["security"] = [{scheme: roles(operation) if scheme == "bearer" else []} for scheme in operation.security]
    return built


def roles(operation: Operation) -> List[str]:
    """What a bearer token needs, as the operation declares it (the admission checks the same declaration):
    OpenAPI 3.1 lets a security requirement name roles for any scheme."""
    if operation.scope in ("read", "write"):
        return [f"{operation.scope}:{{collection}}"]  # or {operation.scope}:* or admin
    if operation.scope == "admin":
        return ["admin"]
    return []  # any valid token: a batch checks each of its operations' own scope


# On every response: the request's id (but on a refusal before its head was read), its traceparent with tracing
# on (components.headers).
_EVERY_RESPONSE = ("X-Request-ID", "traceparent")


def response(answer: Response) -> Json:
    built: Json = {"description": answer.description}
    built["headers"] = {name: ref("headers", name) for name in answer.headers}
    for name in (*answer.optional, *_EVERY_RESPONSE):  # inline: a reference cannot say "not required"
        built["headers"][name] = {**headers()[name], "required": False}
    if answer.content is not None:
        built["content"] = answer.content
    elif answer.schema is not None:
        schema = ref("schemas", answer.schema) if isinstance(answer.schema, str) else answer.schema
        built["content"] = {answer.media: {"schema": schema}}
    return built


def errors(statuses: Iterable[int], details: Optional[Mapping[int, str]] = None) -> Dict[str, Json]:
    """Problem responses; ``details`` rewords a status's shared description."""
    details = details or {}
    return {
        str(status): response(
            Response(details.get(status, ERRORS[status]), "Problem", ERROR_HEADERS.get(status, ()), PROBLEM_TYPE)
        )
        for status in sorted(statuses)
    }


def _head_of(get: Json, operation_id: str) -> Json:
    """HEAD: the GET operation, answering the same headers with no body."""
    head = copy.deepcopy(get)
    head["operationId"] = operation_id
    head["summary"] = "Same as GET, headers only: " + get["summary"][0].lower() + get["summary"][1:]
    for answer in head["responses"].values():
        answer.pop("content", None)
    return head


def _options(name: str, methods: List[str]) -> Json:
    allowed = ", ".join([*methods, "OPTIONS"])
    described = Response(
        f"`Allow: {allowed}`. A preflight (`Access-Control-Request-Method`) from an origin in"
        " `JETWAY_CORS_ORIGINS` also gets `Access-Control-Allow-Origin`, `-Allow-Methods`, `-Allow-Headers`"
        " and `-Max-Age`; it needs no token.",
        headers=("Allow",),
    )
    return {
        "operationId": f"options{name}",
        "summary": "What the path supports; answers a browser's CORS preflight",
        "tags": ["meta"],
        "responses": {"204": response(described)},
    }
