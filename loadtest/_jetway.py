"""What the locust users share: the scenario's options, the token, the seed.

Every size, count, share and weight of the scenario is a command-line option
(or environment variable, or locust.conf entry), listed by
``locust -f loadtest/ --help``. On the process that runs the test (the
master, or the only process) the test data is written through the API at
test start, and the token is found or made (``_token``); workers get the
token with the other options from the master.
"""

from __future__ import annotations

import http.client
import logging
import random
import time
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

import _data
import _token
import gevent
import locust.stats
from gevent.pool import Pool
from locust import FastHttpUser, constant, constant_throughput, events
from locust.env import Environment
from locust.runners import WorkerRunner

log = logging.getLogger("jetway")
SEED_CONCURRENCY = 16
SMALL, LARGE, WRITE = "small", "large", "write"
PREFIXES = {SMALL: "s", LARGE: "l", WRITE: "w"}


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    def option(name: str, kind: type, default: Any, text: str, **extra: Any) -> None:
        env = "LOCUST_" + name.lstrip("-").replace("-", "_").upper()
        parser.add_argument(name, type=kind, default=default, env_var=env, help=text, **extra)

    option("--reader-weight", float, 6.0, "share of users that read documents")
    option("--writer-weight", float, 2.0, "share of users that PUT and PATCH with If-Match")
    option("--lister-weight", float, 2.0, "share of users that page through a collection and multi-get")
    option("--batch-writer-weight", float, 0.0, "share of users that write through POST /v1/_batch (0: none)")
    option("--batch-size", int, 20, "operations per batch")
    option("--batch-get-share", float, 0.2, "share of a batch's operations that read (the rest PUT)")
    option("--user-rate", float, 5.0, "visits (tasks) per second each user aims at (0: as fast as it can)")
    option("--small-bytes", int, 200, "size of a small document")
    option("--large-bytes", int, 10240, "size of a large document")
    option("--small-docs", int, 1000, "small documents seeded (listers page through these)")
    option("--large-docs", int, 200, "large documents seeded")
    option("--hot-docs", int, 20, "the first N documents of each size are the hot ones")
    option("--hot-share", float, 0.9, "share of reads that go to a hot document")
    option("--large-share", float, 0.2, "share of reads that go to a large document")
    option("--revalidate-share", float, 0.3, "share of reads of a known document sent with If-None-Match")
    option("--write-docs", int, 100, "documents the writers share (and race on)")
    option("--patch-share", float, 0.5, "share of writes that are merge PATCHes (the rest are PUTs)")
    option("--max-retries", int, 10, "times a writer retries after a 412 before giving up")
    option("--page-size", int, 100, "limit= of a list page")
    option("--max-pages", int, 3, "pages a lister follows with the cursor before starting over")
    option("--multi-get", int, 20, "ids per multi-get")
    option("--multi-get-share", float, 0.5, "share of lister visits that multi-get instead of paging")
    option("--multi-get-post", int, 500, "ids per multi-get by POST /v1/_get/{coll} (the ids in a body)")
    option("--multi-get-post-share", float, 0.2, "share of multi-gets sent by POST, with --multi-get-post ids")
    option("--collection-prefix", str, "loadtest", "collections are PREFIX-small, PREFIX-large, PREFIX-write")
    option("--warmup", float, 0.0, "seconds of load, after seeding, whose figures are dropped (PyPy's JIT warms up)")
    option("--measure-time", float, 0.0, "seconds measured after seeding and warm-up, then quit (0: locust's -t)")
    option("--skip-seed", int, 0, "1: the data is there already; do not write it at test start")
    option("--jetway-python", str, str(_token.DEFAULT_PYTHON), "Python of the Jetway environment (admin CLI)")
    parser.add_argument(
        "--jetway-token",
        default="",
        env_var="JETWAY_TOKEN",
        is_secret=True,
        help="bearer token (default: made with the admin CLI if there is one)",
    )


class Scenario:
    """The options of this run, read where a user needs them."""

    def __init__(self, options: Any) -> None:
        self.options = options

    def __getattr__(self, name: str) -> Any:
        return getattr(self.options, name)

    def collection(self, kind: str) -> str:
        return f"{self.options.collection_prefix}-{kind}"

    def ids(self, kind: str) -> List[str]:
        count = {SMALL: self.small_docs, LARGE: self.large_docs, WRITE: self.write_docs}[kind]
        return _data.ids(PREFIXES[kind], count)

    def size(self, kind: str) -> int:
        return self.large_bytes if kind == LARGE else self.small_bytes

    def headers(self) -> Dict[str, str]:
        token = self.options.jetway_token
        return {"Authorization": f"Bearer {token}"} if token else {}


def _finer_buckets(response_time: float) -> float:
    """Two significant digits below 100 ms too: a loopback read takes ~1 ms,
    and locust's whole milliseconds would make p95 jump by 50% at a time."""
    if response_time >= 100 or response_time <= 0:
        return _locust_buckets(response_time)
    return float(f"{response_time:.2g}")


_locust_buckets = locust.stats.bucket_response_time
locust.stats.bucket_response_time = _finer_buckets


class JetwayUser(FastHttpUser):
    """Base of the users: the token on every request, the pace from the options."""

    abstract = True
    weight_option = ""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        self.scenario = Scenario(environment.parsed_options)
        self.auth = self.scenario.headers()

    def wait_time(self) -> float:
        rate = self.scenario.user_rate
        return constant_throughput(rate)(self) if rate > 0 else constant(0)(self)

    def headers(self, **extra: str) -> Dict[str, str]:
        return {**self.auth, **extra}


@events.init.add_listener
def on_init(environment: Environment, **_: Any) -> None:
    if not isinstance(environment.runner, WorkerRunner):
        run = TestRun(environment)
        environment.events.test_start.add_listener(run.start)
        environment.events.quit.add_listener(run.quit)


class TestRun:
    """Test start and quit on the master (or the only process)."""

    def __init__(self, environment: Environment) -> None:
        self.environment = environment
        self.token: Optional[_token.Resolved] = None

    def start(self, **_: Any) -> None:
        options = self.environment.parsed_options
        for user_class in self.environment.user_classes:
            if getattr(user_class, "weight_option", ""):
                user_class.weight = getattr(options, user_class.weight_option)
        try:
            if self.token is None:
                self.token = _token.resolve(options.jetway_python, _token.default_redis_url(), options.jetway_token)
                log.info("jetway: token: %s", self.token.source)
            options.jetway_token = self.token.token or ""
            if not options.skip_seed:
                _seed(Scenario(options), self.environment.host or "")
        except Exception as error:
            log.error("jetway: the test cannot start: %s", error)
            self.environment.process_exit_code = 2
            gevent.spawn(self.environment.runner.quit)
            return
        if options.warmup > 0:
            gevent.spawn_later(options.warmup, self._end_warmup)
        if options.measure_time > 0:
            gevent.spawn_later(options.warmup + options.measure_time, self._end_measuring)

    def _end_warmup(self) -> None:
        log.info("jetway: warm-up over; counting from now on")
        self.environment.runner.stats.reset_all()

    def _end_measuring(self) -> None:
        log.info("jetway: measured for %.0f s; quitting", self.environment.parsed_options.measure_time)
        self.environment.runner.quit()

    def quit(self, **_: Any) -> None:
        if self.token is not None and self.token.made_as:
            options = self.environment.parsed_options
            _token.revoke(options.jetway_python, _token.default_redis_url(), self.token.made_as)


def _seed(scenario: Scenario, host: str) -> None:
    started = time.monotonic()
    jobs: List[Tuple[str, bytes]] = []
    for kind in (SMALL, LARGE, WRITE):
        for doc_id in scenario.ids(kind):
            jobs.append((f"/v1/{scenario.collection(kind)}/{doc_id}", _data.document(doc_id, scenario.size(kind))))
    seeder = Seeder(host, scenario.headers())
    Pool(SEED_CONCURRENCY).map(seeder.put, [jobs[n::SEED_CONCURRENCY] for n in range(SEED_CONCURRENCY)])
    log.info("jetway: seeded %d documents in %.1f s", len(jobs), time.monotonic() - started)


class Seeder:
    """PUTs documents over one keep-alive connection per greenlet."""

    def __init__(self, host: str, headers: Dict[str, str]) -> None:
        self.url = urlsplit(host)
        self.headers = {**headers, "Content-Type": "application/json"}

    def put(self, jobs: List[Tuple[str, bytes]]) -> None:
        connection: Optional[http.client.HTTPConnection] = None
        try:
            connection = http.client.HTTPConnection(self.url.hostname, self.url.port or 80, timeout=30)
            for path, body in jobs:
                connection.request("PUT", self.url.path.rstrip("/") + path, body=body, headers=self.headers)
                response = connection.getresponse()
                answer = response.read()
                if response.status not in (200, 201):
                    raise RuntimeError(f"seeding PUT {path}: {response.status} {answer[:200]!r}")
        finally:
            if connection is not None:
                connection.close()


def pick(rng: random.Random, ids: List[str], hot: int, hot_share: float) -> Tuple[str, bool]:
    """An id, hot with probability ``hot_share``; and whether it was hot."""
    hot = max(0, min(hot, len(ids)))
    if hot and (hot == len(ids) or rng.random() < hot_share):
        return ids[rng.randrange(hot)], True
    return ids[rng.randrange(hot, len(ids))], False
