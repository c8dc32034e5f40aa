"""handlers.http.auth.Gate keeps the digests of valid tokens, and only theirs, within a bound.

A unit test of the gate alone: the token cache in front of it is a table
of records, because what is checked here is which tokens get hashed, not
Redis (tests/handlers/http/test_auth.py covers revocation and rotation end to end).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import pytest
from twisted.internet import defer

from cache.credentials.tokens import TokenRecord, digest_of
from handlers.http import auth
from handlers.http.errors import ApiError


class RecordTable:
    """Answers ``cached`` and ``lookup`` from a dict, as the token cache does when it holds the record."""

    def __init__(self, records: Dict[bytes, TokenRecord]) -> None:
        self.records = records

    def cached(self, digest: bytes) -> Optional[TokenRecord]:
        return self.records.get(digest)

    def lookup(self, digest: bytes) -> defer.Deferred:
        return defer.succeed(self.records.get(digest))


def record_for(token: str) -> TokenRecord:
    return TokenRecord(digest=digest_of(token), name=token, scopes=("read:*",), rate="", expires=0, created=0)


@pytest.fixture
def hashed(monkeypatch) -> List[str]:
    """The tokens the gate hashes, in order."""
    seen: List[str] = []

    def counting_digest_of(token: str) -> bytes:
        seen.append(token)
        return digest_of(token)

    monkeypatch.setattr(auth, "digest_of", counting_digest_of)
    return seen


def admit(gate: auth.Gate, token: str) -> Optional[int]:
    """The request's error status, or None when it is admitted."""
    outcome: List[object] = []
    gate.admit(f"Bearer {token}", "users", False, False).addBoth(outcome.append)
    result = outcome[0]
    if hasattr(result, "value"):  # a Failure
        assert isinstance(result.value, ApiError)
        return result.value.status_code
    return None


def test_a_valid_token_is_hashed_once_and_an_invalid_one_every_time(hashed):
    gate = auth.Gate(RecordTable({record_for("jw_good").digest: record_for("jw_good")}), None, enabled=True)
    assert [admit(gate, "jw_good") for _ in range(3)] == [None, None, None]
    assert [admit(gate, "jw_guess") for _ in range(3)] == [401, 401, 401]
    assert hashed == ["jw_good", "jw_guess", "jw_guess", "jw_guess"]


def test_a_token_no_longer_valid_is_refused_though_its_digest_is_kept(hashed):
    records = {record_for("jw_soon_revoked").digest: record_for("jw_soon_revoked")}
    gate = auth.Gate(RecordTable(records), None, enabled=True)
    assert admit(gate, "jw_soon_revoked") is None
    records.clear()  # revoked: the cache no longer has it, Redis neither
    assert admit(gate, "jw_soon_revoked") == 401
    assert hashed == ["jw_soon_revoked"]


def test_the_kept_digests_are_bounded_and_the_oldest_go_first(hashed, monkeypatch):
    monkeypatch.setattr(auth, "MAX_REMEMBERED_DIGESTS", 2)
    tokens = ["jw_a", "jw_b", "jw_c"]
    gate = auth.Gate(RecordTable({record_for(t).digest: record_for(t) for t in tokens}), None, enabled=True)
    for token in tokens:
        assert admit(gate, token) is None
    hashed.clear()
    assert [admit(gate, token) for token in ("jw_c", "jw_b", "jw_a")] == [None, None, None]
    assert hashed == ["jw_a"]  # pushed out by jw_c


def test_a_record_whose_digest_is_not_the_tokens_is_refused_however_it_was_found():
    """The digest comparison stands though a remembered digest skips it: only the record's own object does."""
    good = record_for("jw_good")
    records = {good.digest: good}
    gate = auth.Gate(RecordTable(records), None, enabled=True)
    assert [admit(gate, "jw_good") for _ in range(2)] == [None, None]
    # The store answers, under the token's digest, a record of another digest.
    records[good.digest] = record_for("jw_other")
    assert admit(gate, "jw_good") == 401


def test_a_new_record_of_the_same_token_is_known_by_identity_after_its_next_request(hashed):
    """The token cache may hold another record of a token (a burst of its first requests): followed."""
    first = record_for("jw_good")
    records = {first.digest: first}
    gate = auth.Gate(RecordTable(records), None, enabled=True)
    assert admit(gate, "jw_good") is None
    assert gate._digests["Bearer jw_good"] is first.digest  # the record's own: no comparison next time
    # Read by another of its first requests: equal bytes, another object.
    again = record_for("jw_good")
    assert again.digest == first.digest and again.digest is not first.digest
    records[first.digest] = again
    assert admit(gate, "jw_good") is None  # compared once, in constant time
    assert gate._digests["Bearer jw_good"] is again.digest  # followed: identity again from now on
    assert hashed == ["jw_good"]
    assert len(gate._digests) == 1


def test_each_spelling_of_the_header_is_hashed_once_and_admitted_alike(hashed):
    """Digests are kept by the whole Authorization value: the scheme in any case, any spaces, one hash each."""
    gate = auth.Gate(RecordTable({record_for("jw_good").digest: record_for("jw_good")}), None, enabled=True)
    spellings = ["Bearer jw_good", "bearer jw_good", "BEARER   jw_good  "]
    for spelling in spellings * 2:
        outcome: List[object] = []
        gate.admit(spelling, "users", False, False).addBoth(outcome.append)
        assert not hasattr(outcome[0], "value")
        assert spelling in gate._digests
    assert hashed == ["jw_good"] * 3
    assert len(gate._digests) == 3


def test_a_long_spelling_of_a_valid_header_is_admitted_but_not_remembered(hashed):
    """Spaces a client pads a valid token with cannot fill the kept digests with long keys."""
    gate = auth.Gate(RecordTable({record_for("jw_good").digest: record_for("jw_good")}), None, enabled=True)
    padded = "Bearer jw_good" + " " * auth.MAX_REMEMBERED_LENGTH
    for _ in range(2):
        outcome: List[object] = []
        gate.admit(padded, "users", False, False).addBoth(outcome.append)
        assert not hasattr(outcome[0], "value")
    assert hashed == ["jw_good", "jw_good"]
    assert padded not in gate._digests
    assert all(len(key) <= auth.MAX_REMEMBERED_LENGTH for key in gate._digests)


def test_a_long_token_spelled_plainly_is_remembered_and_its_padded_spellings_are_not(hashed):
    """A provider's JWT is longer than the short values kept; its one plain spelling (``Bearer <token>``) is
    kept all the same, so its requests after the first pay no hash, while padded spellings still are not."""
    long_token = "eyJ" + "a" * 900 + ".b.c"
    gate = auth.Gate(RecordTable({record_for(long_token).digest: record_for(long_token)}), None, enabled=True)
    plain, padded = "Bearer " + long_token, "Bearer  " + long_token + "  "
    for spelling in (plain, plain, plain, padded, padded):
        outcome: List[object] = []
        gate.admit(spelling, "users", False, False).addBoth(outcome.append)
        assert not hasattr(outcome[0], "value")
    assert hashed == [long_token, long_token, long_token]  # the plain one once, each padded one each time
    assert plain in gate._digests and padded not in gate._digests
    too_long = "Bearer " + "x" * auth.MAX_REMEMBERED_TOKEN_LENGTH
    assert not auth._plainly_spelled(too_long)
