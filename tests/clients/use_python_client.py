"""Every operation through the Python client generated from /openapi.json.

Run by ``tests/process/test_generated_clients.py`` on CPython, with the package that
``openapi-python-client`` made from the running server's own document on
``PYTHONPATH`` as ``jetway_client``; no line of it is edited by hand. Usage:
``use_python_client.py BASE_URL TOKEN``. Exits non-zero at the first call
whose answer is not what the API documents.
"""

from __future__ import annotations

import sys
from http import HTTPStatus
from typing import Any, List

from jetway_client import AuthenticatedClient, Client
from jetway_client.api.batch import run_batch
from jetway_client.api.changes import create_changes_ticket, get_changes
from jetway_client.api.collections import create_document, get_documents, head_collection, list_documents
from jetway_client.api.documents import (
    delete_document,
    get_document,
    head_document,
    patch_document,
    put_document,
)
from jetway_client.api.health import get_health, get_readiness, head_health, head_readiness
from jetway_client.api.meta import (
    get_docs,
    get_docs_asset,
    get_metrics,
    get_open_api,
    head_docs,
    head_docs_asset,
    head_metrics,
    head_open_api,
)
from jetway_client.api.settings import (
    delete_collection_settings,
    get_collection_settings,
    head_collection_settings,
    head_collection_settings_list,
    list_collection_settings,
    put_collection_settings,
)
from jetway_client.api.typed import create_typed_document, list_typed_documents, put_typed_document
from jetway_client.models import (
    BatchCreate,
    BatchDelete,
    BatchGet,
    BatchPatch,
    BatchPut,
    BatchRequest,
    BatchResults,
    ChangesPage,
    CollectionSettings,
    CollectionSettingsList,
    CollectionSettingsSchema,
    DocsAsset,
    Document,
    IdList,
    Items,
    ListTypedDocumentsOrder,
    MergePatch,
    Page,
    Problem,
    Ticket,
    TypedDocument,
)
from jetway_client.types import Response

COLLECTION = "genpy"
PROBLEM = "urn:jetway:problem:"


def expect(response: Response[Any], status: int) -> Any:
    if response.status_code != status:
        raise AssertionError(f"expected {status}, got {response.status_code}: {response.content[:300]!r}")
    return response.parsed


def problem(response: Response[Any], status: int, slug: str) -> Problem:
    parsed = expect(response, status)
    assert isinstance(parsed, Problem), parsed
    assert parsed.status == status and parsed.type_ == PROBLEM + slug, parsed
    return parsed


def document(values: dict) -> Document:
    made = Document()
    made.additional_properties = dict(values)
    return made


def health(anonymous: Client) -> None:
    assert expect(get_health.sync_detailed(client=anonymous), 200).status == "ok"
    assert expect(get_readiness.sync_detailed(client=anonymous), 200).status == "ready"
    assert "# TYPE" in expect(get_metrics.sync_detailed(client=anonymous), 200)
    assert expect(get_open_api.sync_detailed(client=anonymous), 200)["openapi"] == "3.1.0"
    for head in (head_health, head_readiness, head_metrics, head_open_api, head_docs):
        response = head.sync_detailed(client=anonymous)
        assert response.status_code == 200 and response.content == b"", head.__name__


def docs(anonymous: Client) -> None:
    page = get_docs.sync_detailed(client=anonymous)
    assert 'id="swagger-ui"' in expect(page, 200)
    expect(get_docs.sync_detailed(client=anonymous, if_none_match=page.headers["ETag"]), 304)
    assert "SwaggerUIBundle" in expect(get_docs_asset.sync_detailed(DocsAsset.START_JS, client=anonymous), 200)
    head = head_docs_asset.sync_detailed(DocsAsset.SWAGGER_UI_CSS, client=anonymous)
    assert head.status_code == 200 and head.content == b"" and head.headers["Cache-Control"] == "no-cache"


def documents(client: AuthenticatedClient, anonymous: Client) -> None:
    created = put_document.sync_detailed(COLLECTION, "d1", client=client, body=document({"n": 1, "s": "é"}))
    assert expect(created, 201).additional_properties == {"n": 1, "s": "é"}
    etag = created.headers["ETag"]
    problem(
        put_document.sync_detailed(COLLECTION, "d1", client=client, body=document({}), if_none_match="*"),
        412,
        "precondition-failed",
    )
    problem(
        put_document.sync_detailed(COLLECTION, "d1", client=client, body=document({}), if_match='"stale"'),
        412,
        "precondition-failed",
    )
    replaced = put_document.sync_detailed(COLLECTION, "d1", client=client, body=document({"n": 2}), if_match=etag)
    assert expect(replaced, 200)["n"] == 2
    etag = replaced.headers["ETag"]

    got = get_document.sync_detailed(COLLECTION, "d1", client=client)
    assert expect(got, 200).additional_properties == {"n": 2}
    assert got.headers["ETag"] == etag and got.headers["Last-Modified"]
    assert get_document.sync_detailed(COLLECTION, "d1", client=client, if_none_match=etag).status_code == 304
    headed = head_document.sync_detailed(COLLECTION, "d1", client=client)
    assert headed.status_code == 200 and headed.headers["ETag"] == etag and headed.content == b""

    patch = MergePatch()
    patch.additional_properties = {"n": None, "tags": ["a"]}
    patched = patch_document.sync_detailed(COLLECTION, "d1", client=client, body=patch, if_match=etag)
    assert expect(patched, 200).additional_properties == {"tags": ["a"]}
    problem(
        patch_document.sync_detailed(COLLECTION, "d1", client=client, body=patch, if_match=etag),
        412,
        "precondition-failed",
    )

    expect(delete_document.sync_detailed(COLLECTION, "d1", client=client), 204)
    problem(get_document.sync_detailed(COLLECTION, "d1", client=client), 404, "not-found")
    problem(delete_document.sync_detailed(COLLECTION, "d1", client=client), 404, "not-found")
    problem(get_document.sync_detailed(COLLECTION, "a b", client=client), 400, "invalid-id")
    problem(get_document.sync_detailed(COLLECTION, "d1", client=anonymous), 401, "unauthorized")


def collections(client: AuthenticatedClient) -> None:
    made: List[str] = []
    for n in range(7):
        response = create_document.sync_detailed(COLLECTION, client=client, body=document({"n": n}), ttl=3600)
        assert expect(response, 201)["n"] == n
        made.append(response.headers["Location"].rsplit("/", 1)[1])
    assert made == sorted(made), "ids are made in sequence"

    seen: List[int] = []
    cursor: Any = None
    pages = 0
    while True:
        kwargs = {"cursor": cursor} if cursor else {}
        page = expect(list_documents.sync_detailed(COLLECTION, client=client, limit=3, **kwargs), 200)
        assert isinstance(page, Page), page
        seen += [item["n"] for item in page.items]
        pages += 1
        if page.next_ is None:
            break
        cursor = page.next_
    assert seen == list(range(7)) and pages == 3, (seen, pages)
    headed = head_collection.sync_detailed(COLLECTION, client=client)
    assert headed.status_code == 200 and headed.content == b""

    # The multi-get both ways; the GET form goes out as ids=a&ids=b, as this generator sends arrays.
    wanted = [made[2], "missing", made[0], made[2]]
    expected = [{"n": 2}, None, {"n": 0}, {"n": 2}]
    by_get = expect(list_documents.sync_detailed(COLLECTION, client=client, ids=wanted), 200)
    assert isinstance(by_get, Items), by_get
    assert [item and item.additional_properties for item in by_get.items] == expected
    by_post = expect(get_documents.sync_detailed(COLLECTION, client=client, body=IdList(ids=wanted)), 200)
    assert [item and item.additional_properties for item in by_post.items] == expected
    problem(get_documents.sync_detailed(COLLECTION, client=client, body=IdList(ids=["ok", ".."])), 400, "invalid-id")
    problem(list_documents.sync_detailed(COLLECTION, client=client, limit=0), 400, "invalid-limit")


def batch(client: AuthenticatedClient) -> None:
    patch = MergePatch()
    patch.additional_properties = {"m": 2}
    operations: List[Any] = [
        BatchPut(op="put", collection=COLLECTION, id="b1", document=document({"n": 1})),
        BatchCreate(op="create", collection=COLLECTION, document=document({"n": 2})),
        BatchPatch(op="patch", collection=COLLECTION, id="b1", patch=patch),
        BatchGet(op="get", collection=COLLECTION, id="b1"),
        BatchDelete(op="delete", collection=COLLECTION, id="b1"),
        BatchGet(op="get", collection=COLLECTION, id="b1"),
    ]
    request = BatchRequest(operations=operations)
    answer = expect(run_batch.sync_detailed(client=client, body=request, idempotency_key="genpy-batch"), 200)
    assert isinstance(answer, BatchResults), answer
    assert [result.status for result in answer.results] == [201, 201, 200, 200, 204, 404], answer
    assert answer.results[3].document.additional_properties == {"n": 1, "m": 2}
    assert answer.results[5].problem.type_ == PROBLEM + "not-found"
    replayed = run_batch.sync_detailed(client=client, body=request, idempotency_key="genpy-batch")
    assert replayed.headers["Idempotency-Replayed"] == "true"
    assert [result.status for result in expect(replayed, 200).results] == [201, 201, 200, 200, 204, 404]
    problem(run_batch.sync_detailed(client=client, body=BatchRequest(operations=[])), 400, "invalid-batch")


def collection_settings(client: AuthenticatedClient) -> None:
    """The settings operations, and collection ``typed``'s own typed writes (its schema set by the test)."""
    rules = "genpy-rules"
    schema = CollectionSettingsSchema()
    schema.additional_properties = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    made = put_collection_settings.sync_detailed(rules, client=client, body=CollectionSettings(schema=schema, ttl=60))
    assert expect(made, 201).ttl == 60
    etag = made.headers["ETag"]
    got = expect(get_collection_settings.sync_detailed(rules, client=client), 200)
    assert isinstance(got, CollectionSettings) and got.schema.additional_properties["required"] == ["n"]
    assert get_collection_settings.sync_detailed(rules, client=client, if_none_match=etag).status_code == 304
    assert head_collection_settings.sync_detailed(rules, client=client).headers["ETag"] == etag
    listed = expect(list_collection_settings.sync_detailed(client=client), 200)
    assert isinstance(listed, CollectionSettingsList)
    assert {item.collection for item in listed.items} == {rules, "typed"}
    assert head_collection_settings_list.sync_detailed(client=client).status_code == 200
    bad = CollectionSettingsSchema()
    bad.additional_properties = {"type": "nope"}
    problem(
        put_collection_settings.sync_detailed(rules, client=client, body=CollectionSettings(schema=bad)),
        422,
        "invalid-schema",
    )
    violation = problem(
        put_document.sync_detailed(rules, "r1", client=client, body=document({"n": "one"})), 422, "schema-violation"
    )
    assert [(error.pointer, error.keyword) for error in violation.errors] == [("/n", "type")]
    problem(
        delete_collection_settings.sync_detailed(rules, client=client, if_match='"stale"'), 412, "precondition-failed"
    )
    expect(delete_collection_settings.sync_detailed(rules, client=client, if_match=etag), 204)
    problem(get_collection_settings.sync_detailed(rules, client=client), 404, "not-found")

    typed = TypedDocument(email="ada@example.com", age=36)
    assert expect(put_typed_document.sync_detailed("t1", client=client, body=typed), 201)["age"] == 36
    assert expect(create_typed_document.sync_detailed(client=client, body=typed), 201)["email"] == "ada@example.com"
    refused = put_typed_document.sync_detailed("t2", client=client, body=TypedDocument(email="not an email"))
    assert problem(refused, 422, "schema-violation").errors[0].keyword == "format"


def typed_query(client: AuthenticatedClient) -> None:
    """One query with in on collection ``typed``'s index (email, age): the values' documents merged by age,
    newest first, paged; a value its schema's format rules out is still the server's to refuse."""
    for doc_id, email, age in (("q1", "grace@example.com", 40), ("q2", "linus@example.com", 50)):
        expect(put_typed_document.sync_detailed(doc_id, client=client, body=TypedDocument(email=email, age=age)), 201)
    asked = {
        "email": ['in.(grace@example.com,"ada@example.com")'],
        "order": ListTypedDocumentsOrder.AGE_DESC,
        "limit": 2,
    }
    seen: List[Any] = []
    cursor: Any = None
    while True:
        kwargs = {"cursor": cursor} if cursor else {}
        page = expect(list_typed_documents.sync_detailed(client=client, **asked, **kwargs), 200)
        assert isinstance(page, Page), page
        seen += [(item["email"], item["age"]) for item in page.items]
        if page.next_ is None:
            break
        cursor = page.next_
    # t1 and the created one: ada, 36 (by id, descending, after grace's 40).
    assert seen == [("grace@example.com", 40), ("ada@example.com", 36), ("ada@example.com", 36)], seen
    refused = list_typed_documents.sync_detailed(client=client, email=["in.(a,b,c"])
    problem(refused, 400, "invalid-query")


def typed_contains(client: AuthenticatedClient) -> None:
    """One query with cs on collection ``typed``'s array index (tags, string[]): the documents whose tags hold
    red, by id, each once however often red is in its array, paged one by one; two values are the server's 400."""
    tagged = {"c1": ["red", "blue", "red"], "c2": ["blue"], "c3": ["red", "red", "red"], "c4": ["green", "red"]}
    for age, (doc_id, tags) in enumerate(tagged.items(), 1):
        body = TypedDocument(email="tagged@example.com", age=age, tags=tags)
        expect(put_typed_document.sync_detailed(doc_id, client=client, body=body), 201)
    seen: List[Any] = []
    cursor: Any = None
    while True:
        kwargs = {"cursor": cursor} if cursor else {}
        page = expect(list_typed_documents.sync_detailed(client=client, tags=["cs.{red}"], limit=1, **kwargs), 200)
        assert isinstance(page, Page), page
        seen += [(item["age"], item["tags"]) for item in page.items]
        if page.next_ is None:
            break
        cursor = page.next_
    assert seen == [(1, tagged["c1"]), (3, tagged["c3"]), (4, tagged["c4"])], seen
    assert len({age for age, _ in seen}) == len(seen), seen
    # Their count, with the second page: Prefer a header parameter, Content-Range a response header.
    first = list_typed_documents.sync_detailed(client=client, tags=["cs.{red}"], limit=1)
    counted = list_typed_documents.sync_detailed(
        client=client, tags=["cs.{red}"], limit=1, cursor=expect(first, 200).next_, prefer="count=exact"
    )
    assert [item["age"] for item in expect(counted, 200).items] == [3]
    assert counted.headers["Content-Range"] == "1-1/3" and counted.headers["Preference-Applied"] == "count=exact"
    problem(list_typed_documents.sync_detailed(client=client, tags=["cs.{red,blue}"]), 400, "invalid-query")


def changes(client: AuthenticatedClient, base_url: str) -> None:
    """The change feed's long poll, with the token and with a ticket (what EventSource sends)."""
    now = expect(get_changes.sync_detailed(COLLECTION, client=client, wait=0), 200)
    assert isinstance(now, ChangesPage) and now.events == [], now
    expect(put_document.sync_detailed(COLLECTION, "f1", client=client, body=document({"f": 1})), 201)
    later = expect(get_changes.sync_detailed(COLLECTION, client=client, since=now.next_, wait=5), 200)
    assert [(event.op.value, event.id) for event in later.events] == [("put", "f1")], later
    ticket = expect(create_changes_ticket.sync_detailed(COLLECTION, client=client), 201)
    assert isinstance(ticket, Ticket) and ticket.expires_at, ticket
    # The ticket is a query-string scheme, which this generator leaves to the caller's httpx arguments.
    by_ticket = Client(base_url=base_url, httpx_args={"params": {"ticket": ticket.ticket}})
    again = expect(get_changes.sync_detailed(COLLECTION, client=by_ticket, since=now.next_, wait=0), 200)
    assert [event.id for event in again.events] == ["f1"], again
    problem(get_changes.sync_detailed(COLLECTION, client=client, limit=0), 400, "invalid-limit")


def main(base_url: str, token: str) -> None:
    anonymous = Client(base_url=base_url, raise_on_unexpected_status=True)
    client = AuthenticatedClient(base_url=base_url, token=token, raise_on_unexpected_status=True)
    health(anonymous)
    docs(anonymous)
    documents(client, anonymous)
    collections(client)
    batch(client)
    collection_settings(client)
    typed_query(client)
    typed_contains(client)
    changes(client, base_url)
    print(f"python client: every operation answered as documented ({HTTPStatus.OK.phrase})")


if __name__ == "__main__":
    main(*sys.argv[1:3])
