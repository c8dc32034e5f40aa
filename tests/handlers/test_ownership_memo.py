"""The owner a read under the rule finds in a document is remembered on it, and only for the rule that found it."""

from __future__ import annotations

import pytest

from cache.collection_settings import indexes_of
from cache.documents.document import Document
from cache.indexes.declared import IndexDeclarationError
from cache.ownership import owner_rule
from handlers.ownership import visible_document


def test_a_documents_owner_is_found_once_per_rule():
    document = Document(b'{"owner": "alice", "by": "bob"}', b'"t1"', b"Sun, 29 Nov 2026 00:00:00 GMT")
    by_owner, by_by = owner_rule({"pointer": "/owner"}), owner_rule({"pointer": "/by"})
    assert visible_document(by_owner, "alice", document) and not visible_document(by_owner, "bob", document)
    assert document.owner_found == (by_owner, "alice")
    assert visible_document(by_by, "bob", document) and not visible_document(by_by, "alice", document)  # re-read
    assert not visible_document(by_by, "", document)  # NOBODY owns nothing


def test_an_unreadable_or_ownerless_body_is_no_ones():
    rule = owner_rule({"pointer": "/owner"})
    for body in (b"{not json", b'{"owner": 7}', b'{"owner": ""}', b"[]"):
        assert not visible_document(rule, "alice", Document(body, b'"t"', b""))


def test_a_declared_field_named_as_the_rules_must_be_the_rules_member_and_type():
    owner = {"pointer": "/owner"}

    def declared(field):
        return {"owner": owner, "indexes": {"mine": {"fields": [{"name": "_owner", **field}]}}}

    assert len(indexes_of(declared({"pointer": "/owner", "type": "string"}))) == 2  # the same field: fine
    for other in ({"pointer": "/by", "type": "string"}, {"pointer": "/owner", "type": "string[]"}):
        with pytest.raises(IndexDeclarationError, match="owner rule's own"):
            indexes_of(declared(other))
