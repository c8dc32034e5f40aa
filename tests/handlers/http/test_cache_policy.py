"""handlers.http.cache_policy: the operator's Cache-Control, checked when set and sent on reads."""

import pytest

from api.config import ConfigError, from_environment
from handlers.http.cache_policy import cache_policy


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("no-cache", "no-cache"),
        ("No-Store", "no-store"),
        ("private, max-age=60", "private, max-age=60"),
        ("public,max-age=0,must-revalidate", "public, max-age=0, must-revalidate"),
        ("max-age=31536000, immutable", "max-age=31536000, immutable"),
        ("s-maxage=10, stale-while-revalidate=30", "s-maxage=10, stale-while-revalidate=30"),
    ],
)
def test_valid_policies_are_normalized(text, normalized):
    assert cache_policy(text) == normalized


@pytest.mark.parametrize(
    "text",
    ["", "max-age", "max-age=-1", "max-age=x", "nocache", "private, public", "no-cache, no-cache", "only-if-cached"],
)
def test_invalid_policies_are_refused(text):
    with pytest.raises(ValueError):
        cache_policy(text)


def test_a_bad_environment_value_names_its_variable():
    with pytest.raises(ConfigError, match="JETWAY_CACHE_CONTROL"):
        from_environment({"JETWAY_CACHE_CONTROL": "max-age=soon"})
    assert from_environment({"JETWAY_CACHE_CONTROL": "Private, Max-Age=5"}).cache_control == "private, max-age=5"
    assert from_environment({}).cache_control == "no-cache"


def test_reads_carry_the_policy_and_errors_no_store(api):
    api.put_json("/v1/docs/d1", b'{"a":1}')
    read = api.get("/v1/docs/d1")
    assert read.headers["Cache-Control"] == "no-cache"
    revalidated = api.get("/v1/docs/d1", headers={"If-None-Match": read.headers["ETag"]})
    assert revalidated.status_code == 304 and revalidated.headers["Cache-Control"] == "no-cache"
    assert api.get("/v1/docs?limit=5").headers["Cache-Control"] == "no-cache"
    assert api.get("/v1/docs?ids=d1,d2").headers["Cache-Control"] == "no-cache"
    assert api.post_json("/v1/_get/docs", b'{"ids":["d1"]}').headers["Cache-Control"] == "no-cache"
    assert api.get("/v1/docs/missing").headers["Cache-Control"] == "no-store"
    assert api.get("/v1/Bad/d1").headers["Cache-Control"] == "no-store"
    assert (
        api.request("GET", "/v1/docs/d1", headers={"Authorization": "Bearer nope"}).headers["Cache-Control"]
        == "no-store"
    )


def test_the_connection_s_own_refusals_say_no_store(api):
    response = api.raw("GET", "/v1/docs/" + "x" * 9000)
    assert response.status == 414 and response.headers["Cache-Control"] == "no-store"
