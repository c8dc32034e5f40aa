"""cache.keys: a document and its index entry share a hash slot; stored key layouts stay put."""

from cache import keys
from cache.credentials import tokens


def _hash_tag(key: bytes) -> bytes:
    start = key.index(b"{")
    return key[start + 1 : key.index(b"}", start)]


def test_document_and_its_index_shard_share_a_hash_tag():
    for doc_id in (b"a", b"u1", b"01JABCDEF", b"x" * 128):
        assert _hash_tag(keys.document_key(b"users", doc_id)) == _hash_tag(keys.index_key_for(b"users", doc_id))


def test_a_writes_two_keys_come_from_one_hash_as_each_would_alone():
    for doc_id in (b"a", b"u1", b"01JABCDEF", b"x" * 128):
        pair = (keys.document_key(b"users", doc_id), keys.index_key_for(b"users", doc_id))
        assert keys.document_and_index_keys(b"users", doc_id) == pair


def test_documents_of_one_collection_spread_over_every_shard():
    shards = {keys.shard_of(b"doc-%d" % n) for n in range(1000)}
    assert shards == set(range(keys.INDEX_SHARDS))


def test_layout_is_stable():
    """The layout is a stored format: changing it strands existing data."""
    # crc32(b"u1") == 0x424F9F76, and 0x424F9F76 % 16 == 6
    assert keys.document_key(b"users", b"u1") == b"jw:{users:06}:d:u1"
    assert keys.index_key_for(b"users", b"u1") == b"jw:{users:06}:i"


def test_token_key_layout_is_stable():
    """Tokens are stored under the SHA-256 of the token: a change would revoke every token."""
    # printf jw_example | sha256sum
    digest = b"d0a0c4d6a9e7e25ea46764986bcd08ec766ae44f7c1a92098e25fcc92ea51b8e"
    assert tokens.token_key(tokens.digest_of("jw_example")) == b"jw:{tokens}:t:" + digest
