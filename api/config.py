"""Settings, built once from the environment, every value cast and checked.

A bad value raises ``ConfigError`` naming the variable, so the CLI can print
one line and exit instead of a traceback.
"""

from __future__ import annotations

import ipaddress
import os
import re
import resource
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional, Tuple, TypeVar, Union

from cache.credentials.issuers import Issuer, load_issuers
from cache.documents.write_concern import PRIMARY_ONLY, WriteConcern
from cache.redis.address import RedisAddress, parse_redis_url
from handlers.http.cache_policy import DEFAULT_POLICY, cache_policy

T = TypeVar("T")
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

__all__ = ["ConfigError", "Settings", "from_environment", "replace"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# An origin as browsers send it: scheme, host and maybe a port; no path.
_ORIGIN = re.compile(r"https?://(?:[a-z0-9.-]+|\[[0-9a-f:.]+\])(?::\d{1,5})?\Z")
# An OTLP/HTTP collector's base URL: scheme, host, maybe a port and a path; no spaces.
_HTTP_URL = re.compile(r"https?://[^\s/?#]+(?:/[^\s?#]*)?\Z")


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    redis_url: str = DEFAULT_REDIS_URL
    redis: RedisAddress = field(default_factory=RedisAddress)
    redis_timeout: float = 2.0
    redis_pool: int = 4
    max_body: int = 1024 * 1024
    # Ids one multi-get may ask for (by GET, the request line bounds it first).
    max_ids: int = 1000
    # Bytes of stored documents one answer may compose: a multi-get, a list page, a batch's
    # gets (cache/documents/bounded_reads.py; docs/limits.md). At least max_body, so any document fits.
    max_response_bytes: int = 16 * 1024 * 1024
    access_log: bool = True
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    grace: float = 10.0
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    # Bytes per second a streamed body (an import's) must average past its first body_timeout seconds.
    body_min_rate: int = 500
    # Longer than an AWS load balancer's default 60 s idle timeout, so the
    # balancer, not Jetway, closes an idle connection: otherwise it may send a
    # request on a connection Jetway is closing, and answer the client 502.
    keepalive_timeout: float = 75.0
    # Queued output that a client does not read for this long aborts its
    # connection (nginx's send_timeout is 60 s; a response here is small).
    send_timeout: float = 30.0
    # Bytes of request bodies a worker holds at once (docs/operations.md, "Hostile clients").
    body_budget: int = 64 * 1024 * 1024
    max_connections: int = field(default_factory=lambda: _default_max_connections())
    trusted_proxies: Tuple[Network, ...] = ()
    auth: bool = True
    # The OpenID Connect issuers whose JWTs are bearer tokens beside Jetway's own (docs/identity.md).
    oidc_issuers: Tuple[Issuer, ...] = ()
    json_logs: bool = True
    # Replicas that must have a write before it is answered (cache/documents/write_concern.py).
    write_concern: WriteConcern = PRIMARY_ONLY
    # What each worker's hot cache may add to its memory (cache/hot/cache.py, HEAP_GROWTH); 0: no cache.
    hot_cache_bytes: int = 64 * 1024 * 1024
    # Seconds the hot cache's invalidations may lag before it is bypassed (cache/hot/tracking.py, the heartbeat).
    hot_cache_max_lag: float = 0.05
    # Operations with a pipeline (handlers/pipeline.py) answered by the connection, without Cyclone; off:
    # DocumentHandler runs the same pipelines (what they are compared with, in tests and benchmarks).
    direct_answers: bool = True
    # Requests a worker serves itself before it takes a client's, so that PyPy has
    # compiled them (api/warm_up.py); 0: none.
    warm_up: int = 12000
    # CPU burnt per request, for testing the load-test gate only (api/debug_burn.py).
    debug_burn_us: int = 0
    # Cache-Control of document and list responses (handlers/http/cache_policy.py).
    cache_control: str = DEFAULT_POLICY
    # Documents of at least this many bytes are stored with compressed variants (cache/documents/variants.py); 0: none.
    compress_min_bytes: int = 1024
    # Browser origins allowed to call the API (handlers/http/cors.py); "*" for any.
    cors_origins: Tuple[str, ...] = ()
    # The change feed (cache/feed/streams.py): on, how many events a collection
    # keeps and for how long (0: no age cap), the bytes of events it keeps,
    # what a subscriber may leave unread, the longest long poll, a ticket's lifetime.
    feed: bool = True
    feed_max_events: int = 100_000
    feed_max_age: int = 0
    feed_max_bytes: int = 64 * 1024 * 1024
    feed_buffer: int = 1024 * 1024
    feed_max_wait: int = 60
    feed_ticket_ttl: int = 3600
    # Seconds an Idempotency-Key's attempt holds its claim before a retry may take it over (cache/documents/).
    idempotency_lease: float = 10.0
    # Operations and bytes one POST /v1/_batch may carry (handlers/batch.py).
    max_batch_ops: int = 1000
    max_batch_bytes: int = 8 * 1024 * 1024
    # Swagger UI at /docs (handlers/docs.py).
    docs: bool = True
    # Traces over OTLP/HTTP (api/tracing.py, docs/tracing.md): the collector's base URL ("": off), the share of
    # new traces sampled (a request's traceparent decides for its own), and the service name spans carry.
    tracing_endpoint: str = ""
    tracing_sample: float = 1.0
    tracing_service: str = "jetway"
    # The span queue (api/span_queue.py): spans held, spans per POST (at most the queue), and milliseconds a span
    # waits at most for its batch; the SDK's batch processor's variables (OTEL_BSP_*) and defaults.
    tracing_queue: int = 2048
    tracing_batch: int = 512
    tracing_delay_ms: int = 5000


def from_environment(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """Read ``JETWAY_*`` and ``REDIS_URL``; unset variables keep the defaults."""
    env = os.environ if environ is None else environ
    defaults = Settings()

    def read(name: str, cast: Callable[[str], T], default: T) -> T:
        text = env.get(name)
        if text is None or text == "":
            return default
        try:
            return cast(text)
        except ValueError as error:
            raise ConfigError(f"{name}={text!r}: {error}") from None

    redis_url = env.get("REDIS_URL") or DEFAULT_REDIS_URL
    tracing_queue = read("OTEL_BSP_MAX_QUEUE_SIZE", _positive_int, defaults.tracing_queue)
    max_body = read("JETWAY_MAX_BODY", _positive_int, defaults.max_body)
    # Room for at least one body of the largest size, whatever the budget.
    body_budget = read("JETWAY_BODY_BUDGET", _positive_int, max(defaults.body_budget, max_body))
    if body_budget < max_body:
        raise ConfigError(f"JETWAY_BODY_BUDGET={body_budget}: must be at least JETWAY_MAX_BODY ({max_body})")
    # Unset, it follows a larger body limit; set, every document must fit in it.
    max_response_bytes = read("JETWAY_MAX_RESPONSE_BYTES", _positive_int, max(defaults.max_response_bytes, max_body))
    if max_response_bytes < max_body:
        raise ConfigError(
            f"JETWAY_MAX_RESPONSE_BYTES={max_response_bytes}: must be at least JETWAY_MAX_BODY ({max_body})"
        )
    redis_timeout = read("JETWAY_REDIS_TIMEOUT", _positive_float, defaults.redis_timeout)
    # Unset, it follows a smaller body budget; set, it must fit in it.
    max_batch_bytes = read("JETWAY_MAX_BATCH_BYTES", _positive_int, min(defaults.max_batch_bytes, body_budget))
    if max_batch_bytes > body_budget:
        raise ConfigError(
            f"JETWAY_MAX_BATCH_BYTES={max_batch_bytes}: must be at most JETWAY_BODY_BUDGET ({body_budget})"
        )
    write_concern = WriteConcern(
        read("JETWAY_WRITE_REPLICAS", _non_negative_int, PRIMARY_ONLY.replicas),
        read("JETWAY_WRITE_TIMEOUT", _positive_float, PRIMARY_ONLY.timeout),
    )
    if write_concern.waits and write_concern.timeout >= redis_timeout:
        # A WAIT that outlived the reply deadline would be taken for a Redis that stopped answering.
        raise ConfigError(
            f"JETWAY_WRITE_TIMEOUT={write_concern.timeout:g}: must be less than"
            f" JETWAY_REDIS_TIMEOUT ({redis_timeout:g})"
        )
    return Settings(
        host=read("JETWAY_HOST", str, defaults.host),
        port=read("JETWAY_PORT", _port, defaults.port),
        redis_url=redis_url,
        redis=read("REDIS_URL", parse_redis_url, parse_redis_url(DEFAULT_REDIS_URL)),
        redis_timeout=redis_timeout,
        redis_pool=read("JETWAY_REDIS_POOL", _positive_int, defaults.redis_pool),
        max_body=max_body,
        max_ids=read("JETWAY_MAX_IDS", _positive_int, defaults.max_ids),
        max_response_bytes=max_response_bytes,
        access_log=read("JETWAY_ACCESS_LOG", _flag, defaults.access_log),
        workers=read("JETWAY_WORKERS", _positive_int, defaults.workers),
        grace=read("JETWAY_GRACE", _positive_float, defaults.grace),
        header_timeout=read("JETWAY_HEADER_TIMEOUT", _positive_float, defaults.header_timeout),
        body_timeout=read("JETWAY_BODY_TIMEOUT", _positive_float, defaults.body_timeout),
        body_min_rate=read("JETWAY_BODY_MIN_RATE", _positive_int, defaults.body_min_rate),
        keepalive_timeout=read("JETWAY_KEEPALIVE_TIMEOUT", _positive_float, defaults.keepalive_timeout),
        send_timeout=read("JETWAY_SEND_TIMEOUT", _positive_float, defaults.send_timeout),
        body_budget=body_budget,
        max_connections=read("JETWAY_MAX_CONNECTIONS", _positive_int, defaults.max_connections),
        trusted_proxies=read("JETWAY_TRUSTED_PROXIES", _networks, defaults.trusted_proxies),
        auth=read("JETWAY_AUTH", _flag, defaults.auth),
        oidc_issuers=read("JETWAY_OIDC_ISSUERS", load_issuers, defaults.oidc_issuers),
        json_logs=read("JETWAY_LOG_FORMAT", _log_format, defaults.json_logs),
        write_concern=write_concern,
        hot_cache_bytes=read("JETWAY_HOT_CACHE_BYTES", _non_negative_int, defaults.hot_cache_bytes),
        hot_cache_max_lag=read("JETWAY_HOT_CACHE_MAX_LAG_MS", _milliseconds, defaults.hot_cache_max_lag),
        direct_answers=read("JETWAY_DIRECT_ANSWERS", _flag, defaults.direct_answers),
        warm_up=read("JETWAY_WARM_UP", _non_negative_int, defaults.warm_up),
        debug_burn_us=read("JETWAY_DEBUG_BURN_US", _non_negative_int, defaults.debug_burn_us),
        cache_control=read("JETWAY_CACHE_CONTROL", cache_policy, defaults.cache_control),
        compress_min_bytes=read("JETWAY_COMPRESS_MIN_BYTES", _non_negative_int, defaults.compress_min_bytes),
        cors_origins=read("JETWAY_CORS_ORIGINS", _origins, defaults.cors_origins),
        feed=read("JETWAY_FEED", _flag, defaults.feed),
        feed_max_events=read("JETWAY_FEED_MAX_EVENTS", _positive_int, defaults.feed_max_events),
        feed_max_age=read("JETWAY_FEED_MAX_AGE", _non_negative_int, defaults.feed_max_age),
        feed_max_bytes=read("JETWAY_FEED_MAX_BYTES", _positive_int, defaults.feed_max_bytes),
        feed_buffer=read("JETWAY_FEED_BUFFER", _positive_int, defaults.feed_buffer),
        feed_max_wait=read("JETWAY_FEED_MAX_WAIT", _positive_int, defaults.feed_max_wait),
        feed_ticket_ttl=read("JETWAY_FEED_TICKET_TTL", _positive_int, defaults.feed_ticket_ttl),
        idempotency_lease=read("JETWAY_IDEMPOTENCY_LEASE", _positive_float, defaults.idempotency_lease),
        max_batch_ops=read("JETWAY_MAX_BATCH_OPS", _positive_int, defaults.max_batch_ops),
        max_batch_bytes=max_batch_bytes,
        docs=read("JETWAY_DOCS", _flag, defaults.docs),
        tracing_endpoint=read("JETWAY_TRACING_ENDPOINT", _http_url, defaults.tracing_endpoint),
        tracing_sample=read("JETWAY_TRACING_SAMPLE", _ratio, defaults.tracing_sample),
        tracing_service=read("JETWAY_TRACING_SERVICE", _service_name, defaults.tracing_service),
        tracing_queue=tracing_queue,
        tracing_batch=min(read("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _positive_int, defaults.tracing_batch), tracing_queue),
        tracing_delay_ms=read("OTEL_BSP_SCHEDULE_DELAY", _positive_int, defaults.tracing_delay_ms),
    )


def _default_max_connections() -> int:
    # Leave room under the open-files limit for Redis connections, logs and
    # the listening socket, so a full worker refuses politely, not with EMFILE.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, soft - 256)


def _networks(text: str) -> Tuple[Network, ...]:
    try:
        return tuple(ipaddress.ip_network(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as error:
        raise ValueError(f"not a comma-separated list of CIDRs ({error})") from None


def _origins(text: str) -> Tuple[str, ...]:
    origins = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    for origin in origins:
        if origin != "*" and not _ORIGIN.match(origin):
            raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path) or *")
    return origins


def _http_url(text: str) -> str:
    if not _HTTP_URL.match(text):
        raise ValueError(
            "must be an http:// or https:// URL (the collector's OTLP/HTTP base, e.g. http://127.0.0.1:4318)"
        )
    return text


def _ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be a number from 0 to 1")
    return value


def _service_name(text: str) -> str:
    if len(text) > 128 or not text.isprintable():
        raise ValueError("must be at most 128 printable characters")
    return text


def _log_format(text: str) -> bool:
    if text not in ("json", "text"):
        raise ValueError("must be json or text")
    return text == "json"


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError("a port is a number from 0 to 65535")
    return port


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be a whole number above 0")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be a whole number, 0 or more")
    return value


def _milliseconds(text: str) -> float:
    """A positive whole number of milliseconds, as seconds."""
    return _positive_int(text) / 1000.0


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a number of seconds above 0")
    return value


def _flag(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise ValueError("must be on or off")
