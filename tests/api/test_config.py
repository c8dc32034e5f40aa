"""api.config: settings from the environment, bad values named."""

import pytest

from api.config import ConfigError, from_environment
from cache.documents.write_concern import WriteConcern
from cache.redis.address import parse_redis_url


def test_defaults():
    settings = from_environment({})
    assert (settings.host, settings.port, settings.max_body, settings.redis_timeout) == (
        "127.0.0.1",
        8080,
        1048576,
        2.0,
    )
    assert settings.redis.host == "127.0.0.1" and settings.redis.port == 6379
    assert settings.docs is True


def test_jetway_docs_off_turns_the_docs_off():
    assert from_environment({"JETWAY_DOCS": "off"}).docs is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("JETWAY_PORT", "http"),
        ("JETWAY_PORT", "70000"),
        ("JETWAY_MAX_BODY", "0"),
        ("JETWAY_REDIS_TIMEOUT", "-1"),
        ("JETWAY_ACCESS_LOG", "maybe"),
        ("JETWAY_SEND_TIMEOUT", "0"),
        ("JETWAY_BODY_BUDGET", "1000"),
        ("JETWAY_WRITE_REPLICAS", "-1"),
        ("JETWAY_WRITE_REPLICAS", "one"),
        ("JETWAY_WRITE_TIMEOUT", "0"),
        ("JETWAY_DOCS", "maybe"),
        ("REDIS_URL", "http://x"),
        ("REDIS_URL", "redis://h:port/0"),
    ],
)
def test_a_bad_value_names_its_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        from_environment({name: value})


def test_redis_urls():
    assert parse_redis_url("redis://:s3cret@example:6380/2").password == "s3cret"
    assert parse_redis_url("redis://example:6380/2").port == 6380
    assert parse_redis_url("redis://example:6380/2").db == 2
    unix = parse_redis_url("unix:///run/redis.sock?db=3")
    assert (unix.unix_path, unix.db) == ("/run/redis.sock", 3)
    assert "s3cret" not in parse_redis_url("redis://:s3cret@h/0").describe()


def test_a_batch_fits_in_the_body_budget():
    assert from_environment({}).max_batch_bytes == 8 * 1024 * 1024
    assert from_environment({"JETWAY_BODY_BUDGET": "4194304"}).max_batch_bytes == 4194304
    with pytest.raises(ConfigError, match="JETWAY_MAX_BATCH_BYTES=.*at most JETWAY_BODY_BUDGET"):
        from_environment({"JETWAY_BODY_BUDGET": "4194304", "JETWAY_MAX_BATCH_BYTES": "4194305"})


def test_the_body_budget_holds_at_least_one_body_of_the_largest_size():
    assert from_environment({}).body_budget == 64 * 1024 * 1024
    assert from_environment({"JETWAY_MAX_BODY": str(100 * 1024 * 1024)}).body_budget == 100 * 1024 * 1024
    with pytest.raises(ConfigError, match="JETWAY_BODY_BUDGET=.*at least JETWAY_MAX_BODY"):
        from_environment({"JETWAY_MAX_BODY": "2000", "JETWAY_BODY_BUDGET": "1000"})


def test_the_write_concern_defaults_to_the_primary_and_waits_less_than_the_redis_timeout():
    assert from_environment({}).write_concern == WriteConcern(0, 1.0)
    concern = from_environment({"JETWAY_WRITE_REPLICAS": "2", "JETWAY_WRITE_TIMEOUT": "0.25"}).write_concern
    assert concern.waits and concern.wait_command() == (b"WAIT", 2, 250)
    with pytest.raises(ConfigError, match="JETWAY_WRITE_TIMEOUT=2: must be less than JETWAY_REDIS_TIMEOUT"):
        from_environment({"JETWAY_WRITE_REPLICAS": "1", "JETWAY_WRITE_TIMEOUT": "2"})
    # Without a write concern the timeout is unused, and a short Redis timeout is fine.
    assert from_environment({"JETWAY_REDIS_TIMEOUT": "0.5"}).write_concern.timeout == 1.0


def test_the_response_budget_holds_at_least_one_document_of_the_largest_size():
    assert from_environment({}).max_response_bytes == 16 * 1024 * 1024
    assert from_environment({"JETWAY_MAX_BODY": str(32 << 20)}).max_response_bytes == 32 << 20
    assert from_environment({"JETWAY_MAX_RESPONSE_BYTES": "1048576"}).max_response_bytes == 1048576
    with pytest.raises(ConfigError, match="JETWAY_MAX_RESPONSE_BYTES=.*at least JETWAY_MAX_BODY"):
        from_environment({"JETWAY_MAX_BODY": "2000", "JETWAY_MAX_RESPONSE_BYTES": "1999"})
    with pytest.raises(ConfigError, match="JETWAY_MAX_RESPONSE_BYTES='0'"):
        from_environment({"JETWAY_MAX_RESPONSE_BYTES": "0"})
