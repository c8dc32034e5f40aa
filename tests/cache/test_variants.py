"""cache.documents.variants: compressed variants made at write time, stored beside the bytes, sent verbatim."""

import gzip
import json

import pytest
import requests

from cache.documents.variants import NO_VARIANTS, Variants, base_tag, decoded, variant_tag
from cache.keys import document_key
from tests.support import JetwayServer

RAW = {"Accept-Encoding": "identity"}


def large_document(size: int = 10_000) -> bytes:
    """A JSON object of about ``size`` bytes that compresses as real documents do."""
    items = [{"id": n, "name": f"user {n}", "email": f"user{n}@example.com", "score": n * 37 % 101} for n in range(500)]
    body = json.dumps({"items": items}).encode()
    return body[: body.rfind(b"},", 0, size) + 1] + b"]}"


def raw_get(api, path, **headers):
    """A GET whose body is not decoded by the client."""
    response = api.get(path, headers=headers, stream=True)
    response.raw_bytes = response.raw.read(decode_content=False)
    return response


def test_small_documents_get_no_variant_nor_any_document_when_variants_are_off():
    assert Variants(1024).encode(b'{"a":1}') == ()
    assert Variants(1024).encode(large_document(1023)) == ()
    assert NO_VARIANTS.encode(large_document()) == ()


def test_a_large_document_gets_a_gzip_variant_that_decodes_to_its_bytes():
    body = large_document()
    (coding, data), *rest = Variants(1024).encode(body)
    assert coding == "gzip" and not rest
    assert gzip.decompress(data) == body == decoded("gzip", data)
    assert len(data) < len(body) / 3


def test_variant_tags_name_their_document():
    etag = b'"AbC-dEf_123a"'
    assert variant_tag(etag, "gzip") == b'"AbC-dEf_123a-gzip"'
    assert base_tag(variant_tag(etag, "gzip")) == etag
    assert base_tag(etag) == etag


def test_the_variant_is_stored_beside_the_bytes_and_dropped_when_a_smaller_version_replaces_it(api, redis_client):
    body = large_document()
    assert api.put_json("/v1/docs/big", body).status_code == 201
    stored = redis_client.hgetall(document_key(b"docs", b"big"))
    assert stored[b"b"] == body and gzip.decompress(stored[b"g"]) == body
    assert api.put_json("/v1/docs/big", b'{"small":true}').status_code == 200
    assert b"g" not in redis_client.hgetall(document_key(b"docs", b"big"))
    assert api.patch_merge("/v1/docs/big", json.dumps({"pad": "x" * 3000}).encode()).status_code == 200
    assert b"g" in redis_client.hgetall(document_key(b"docs", b"big"))


def test_a_client_that_accepts_gzip_gets_the_stored_variant(api, redis_client):
    body = large_document()
    etag = api.put_json("/v1/docs/big", body).headers["ETag"]
    response = raw_get(api, "/v1/docs/big", **{"Accept-Encoding": "gzip, deflate, br"})
    assert response.status_code == 200
    assert response.headers["Content-Encoding"] == "gzip"
    assert response.headers["Vary"] == "Accept-Encoding"
    assert response.headers["ETag"] == etag[:-1] + '-gzip"'
    assert response.raw_bytes == redis_client.hget(document_key(b"docs", b"big"), b"g")
    assert int(response.headers["Content-Length"]) == len(response.raw_bytes) <= len(body) / 3
    assert gzip.decompress(response.raw_bytes) == body


def test_a_client_that_asks_for_no_coding_gets_the_bytes_as_before(api):
    body = large_document()
    etag = api.put_json("/v1/docs/big", body).headers["ETag"]
    for headers in (RAW, {"Accept-Encoding": "gzip;q=0"}, {"Accept-Encoding": ""}):
        response = raw_get(api, "/v1/docs/big", **headers)
        assert response.raw_bytes == body and "Content-Encoding" not in response.headers
        assert response.headers["ETag"] == etag and response.headers["Vary"] == "Accept-Encoding"
    # requests sends no Accept-Encoding at all when told None.
    plain = api.session.get(api.server.url("/v1/docs/big"), headers={"Accept-Encoding": None}, stream=True)
    assert plain.raw.read(decode_content=False) == body and "Content-Encoding" not in plain.headers


def test_small_documents_are_sent_as_stored_without_vary(api):
    api.put_json("/v1/docs/small", b'{"a":1}')
    response = raw_get(api, "/v1/docs/small", **{"Accept-Encoding": "gzip"})
    assert response.raw_bytes == b'{"a":1}' and "Vary" not in response.headers
    assert "Content-Encoding" not in response.headers


def test_identity_refused_is_406_unless_a_stored_variant_is_accepted(api):
    api.put_json("/v1/docs/small", b'{"a":1}')
    api.put_json("/v1/docs/big", large_document())
    refused = api.get("/v1/docs/small", headers={"Accept-Encoding": "identity;q=0"})
    assert refused.status_code == 406 and refused.headers["Content-Type"] == "application/problem+json"
    assert refused.json()["type"] == "urn:jetway:problem:not-acceptable"
    assert api.get("/v1/docs/big", headers={"Accept-Encoding": "*;q=0"}).status_code == 406
    response = raw_get(api, "/v1/docs/big", **{"Accept-Encoding": "identity;q=0, gzip"})
    assert response.status_code == 200 and response.headers["Content-Encoding"] == "gzip"


def test_any_variant_s_tag_revalidates(api):
    body = large_document()
    etag = api.put_json("/v1/docs/big", body).headers["ETag"]
    gzip_tag = raw_get(api, "/v1/docs/big", **{"Accept-Encoding": "gzip"}).headers["ETag"]
    for tag, encoding in ((gzip_tag, "gzip"), (etag, "gzip"), (gzip_tag, "identity"), (f"W/{gzip_tag}", "gzip")):
        response = api.get("/v1/docs/big", headers={"If-None-Match": tag, "Accept-Encoding": encoding})
        assert response.status_code == 304 and response.headers["ETag"] == tag.removeprefix("W/")
        assert response.headers["Vary"] == "Accept-Encoding"
    star = api.get("/v1/docs/big", headers={"If-None-Match": "*", "Accept-Encoding": "gzip"})
    assert star.status_code == 304 and star.headers["ETag"] == gzip_tag


def test_if_match_takes_a_variant_s_tag(api):
    api.put_json("/v1/docs/big", large_document())
    gzip_tag = raw_get(api, "/v1/docs/big", **{"Accept-Encoding": "gzip"}).headers["ETag"]
    assert api.put_json("/v1/docs/big", b'{"v":2}', headers={"If-Match": gzip_tag}).status_code == 200
    assert api.delete("/v1/docs/big", headers={"If-Match": gzip_tag}).status_code == 412  # the tag is old now


def test_head_sends_the_variant_s_headers_and_no_body(api):
    api.put_json("/v1/docs/big", large_document())
    full = raw_get(api, "/v1/docs/big", **{"Accept-Encoding": "gzip"})
    head = api.head("/v1/docs/big", headers={"Accept-Encoding": "gzip"})
    assert head.status_code == 200 and head.content == b""
    for name in ("Content-Encoding", "Content-Length", "ETag", "Vary"):
        assert head.headers[name] == full.headers[name]


@pytest.mark.parametrize("threshold", ["0", "100000"])
def test_the_threshold_is_a_setting(threshold, redis_server, tmp_path):
    server = JetwayServer(redis_server.url, tmp_path / "jetway.log", env={"JETWAY_COMPRESS_MIN_BYTES": threshold})
    client = redis_server.client()
    try:
        server.start(["--workers", "1"])
        headers = {"Content-Type": "application/json"}
        written = requests.put(server.url("/v1/t/d"), data=large_document(), headers=headers, timeout=10)
        assert written.status_code in (200, 201)
        assert b"g" not in client.hgetall(document_key(b"t", b"d"))
    finally:
        server.stop()
        client.close()


def test_large_list_pages_and_multi_gets_are_gzipped_as_they_are_sent(api):
    for n in range(20):
        api.put_json(f"/v1/docs/d{n:02d}", json.dumps({"n": n, "name": f"user {n}", "pad": "y" * 100}).encode())
    ids = ",".join(f"d{n:02d}" for n in range(20))
    for path in ("/v1/docs?limit=20", f"/v1/docs?ids={ids}"):
        plain = raw_get(api, path, **{"Accept-Encoding": "identity"})
        gzipped = raw_get(api, path, **{"Accept-Encoding": "gzip"})
        assert "Content-Encoding" not in plain.headers and plain.headers["Vary"] == "Accept-Encoding"
        assert gzipped.headers["Content-Encoding"] == "gzip" and gzipped.headers["Vary"] == "Accept-Encoding"
        assert gzip.decompress(gzipped.raw_bytes) == plain.raw_bytes
        assert len(gzipped.raw_bytes) < len(plain.raw_bytes) / 3
    posted = api.post_json("/v1/_get/docs", json.dumps({"ids": ids.split(",")}).encode(), stream=True)
    assert posted.headers["Content-Encoding"] == "gzip"  # requests accepts gzip by default
    small = raw_get(api, "/v1/docs?limit=1", **{"Accept-Encoding": "gzip"})
    assert "Content-Encoding" not in small.headers and small.raw_bytes.startswith(b'{"items":[')
    refused = api.get("/v1/docs?limit=1", headers={"Accept-Encoding": "identity;q=0, gzip"})
    assert refused.status_code == 200 and refused.headers["Content-Encoding"] == "gzip"
    assert api.get("/v1/docs?limit=1", headers={"Accept-Encoding": "*;q=0"}).status_code == 406


def test_list_pages_carry_a_weak_etag_and_revalidate(api):
    api.put_json("/v1/docs/a", b'{"a":1}')
    first = api.get("/v1/docs?limit=10")
    etag = first.headers["ETag"]
    assert etag.startswith('W/"')
    again = api.get("/v1/docs?limit=10", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.headers["ETag"] == etag and again.content == b""
    assert api.get("/v1/docs?ids=a", headers={"If-None-Match": "*"}).status_code == 304
    api.put_json("/v1/docs/b", b'{"b":1}')
    changed = api.get("/v1/docs?limit=10", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["ETag"] != etag
