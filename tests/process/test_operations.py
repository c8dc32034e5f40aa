"""Operating it: /metrics over all workers, JSON logs with request ids, `check`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, Iterator

import pytest
import requests

from tests.process.test_master import worker_pids
from tests.support import ROOT, JetwayServer, wait_until


@pytest.fixture
def observed(redis_server, redis_client, tmp_path) -> Iterator[JetwayServer]:
    server = JetwayServer(redis_server.url, tmp_path / "observed.log", env={"JETWAY_ACCESS_LOG": "on"})
    try:
        server.start(["--workers", "2"])
        wait_until(lambda: len(worker_pids(server)) == 2, 10, "two workers")
        yield server
    finally:
        server.stop()


def scrape(server: JetwayServer) -> Dict[str, float]:
    """``/metrics`` on a fresh connection, as {sample line without value: value}."""
    response = requests.get(server.url("/metrics"), timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def requests_counted(samples: Dict[str, float], route: str, status: str) -> float:
    pattern = re.compile(rf'jetway_requests_total\{{.*route="{route}".*status="{status}".*\}}')
    return sum(value for name, value in samples.items() if pattern.fullmatch(name))


def test_metrics_answer_for_every_worker(observed):
    for _ in range(40):
        assert requests.get(observed.url("/v1/things/none"), timeout=10).status_code == 404
    # Scrapes land on either worker; once each worker has flushed (every
    # second), each scrape must report all 40.
    time.sleep(1.2)
    counts = {requests_counted(scrape(observed), "document", "404") for _ in range(10)}
    assert counts == {40.0}, counts
    samples = scrape(observed)
    assert any(name.startswith("jetway_request_duration_seconds_bucket") for name in samples)
    assert any(name.startswith("jetway_redis_duration_seconds_bucket") for name in samples)
    assert "jetway_open_connections" in samples


def test_worker_restarts_are_counted(observed):
    os.kill(worker_pids(observed)[0], signal.SIGKILL)
    wait_until(lambda: scrape(observed).get("jetway_worker_restarts_total") == 1.0, 15, "the restart to be counted")


def test_redis_errors_are_counted(redis_server, redis_client, tmp_path):
    from tests.support import RedisServer

    own = RedisServer(tmp_path / "redis").start()
    server = JetwayServer(own.url, tmp_path / "errors.log", env={"JETWAY_REDIS_TIMEOUT": "0.5"})
    try:
        server.start(["--workers", "1"])
        own.stop()
        assert requests.get(server.url("/v1/things/a"), timeout=10).status_code == 503
        # The worker that answers a scrape flushes its own counts first.
        assert scrape(server).get('jetway_redis_errors_total{kind="unavailable"}', 0) >= 1
    finally:
        server.stop()
        own.stop()


def log_lines(server: JetwayServer) -> list:
    return [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]


def test_logs_are_one_json_object_per_line_with_request_ids(observed):
    given = requests.get(observed.url("/healthz?given"), headers={"X-Request-ID": "req-123"}, timeout=10)
    made = requests.get(observed.url("/v1/things/nope?made"), timeout=10)
    assert given.headers["X-Request-ID"] == "req-123"
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-ID"])
    bad = requests.get(observed.url("/healthz"), headers={"X-Request-ID": "no spaces allowed"}, timeout=10)
    assert bad.headers["X-Request-ID"] != "no spaces allowed"

    def access(marker: str) -> dict:
        return next(line for line in log_lines(observed) if marker in line.get("path", ""))

    wait_until(lambda: access("made"), 5, "the access lines")
    line = access("given")
    assert (line["request_id"], line["status"], line["method"], line["level"]) == ("req-123", 200, "GET", "info")
    assert access("made")["request_id"] == made.headers["X-Request-ID"]
    assert all({"time", "level", "namespace", "message"} <= set(line) for line in log_lines(observed))
    # Every line of the file is JSON, the master's own among them.
    lines = observed.log_path.read_text().splitlines()
    assert [line for line in lines if not line.startswith("{")] == []
    assert json.loads(lines[0])["message"].startswith("jetway: starting 2 workers on http://")


def test_access_logging_can_be_switched_off(redis_server, redis_client, tmp_path):
    server = JetwayServer(redis_server.url, tmp_path / "quiet.log")  # JETWAY_ACCESS_LOG=off
    try:
        server.start(["--workers", "1"])
        requests.get(server.url("/healthz?quiet"), timeout=10)
        assert "quiet" not in server.log_path.read_text()
        # Metrics still count it.
        assert requests_counted(scrape(server), "healthz", "200") >= 1
    finally:
        server.stop()


def check(redis_url: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "api", "check"],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": redis_url, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_exits_0_when_redis_answers(redis_server):
    result = check(redis_server.url)
    assert result.returncode == 0, result.stderr
    assert "PONG" in result.stdout


def test_check_exits_1_when_redis_is_unreachable(tmp_path):
    result = check(f"unix://{tmp_path}/none.sock", JETWAY_REDIS_TIMEOUT="0.5")
    assert result.returncode == 1
    assert "failed" in result.stderr


def test_check_exits_2_on_a_bad_setting(redis_server):
    result = check(redis_server.url, JETWAY_PORT="http")
    assert result.returncode == 2
    assert "JETWAY_PORT" in result.stderr


def test_every_access_line_is_written_even_when_the_server_stops_right_after(redis_server, redis_client, tmp_path):
    """Lines are written once per reactor turn; a stop flushes the last ones."""
    server = JetwayServer(redis_server.url, tmp_path / "burst.log", env={"JETWAY_ACCESS_LOG": "on"})
    try:
        server.start(["--workers", "2"])
        session = requests.Session()
        for n in range(200):
            assert session.get(server.url(f"/healthz?burst-{n}"), timeout=10).status_code == 200
    finally:
        server.stop()
    paths = [line["path"] for line in log_lines(server) if line.get("namespace") == "jetway.access"]
    assert sorted(path for path in paths if "burst-" in path) == sorted(f"/healthz?burst-{n}" for n in range(200))


def test_access_lines_in_text_format(redis_server, redis_client, tmp_path):
    server = JetwayServer(
        redis_server.url, tmp_path / "text.log", env={"JETWAY_ACCESS_LOG": "on", "JETWAY_LOG_FORMAT": "text"}
    )
    try:
        server.start(["--workers", "1"])
        requests.get(server.url("/healthz?plain"), timeout=10)
        wait_until(lambda: "plain" in server.log_path.read_text(), 5, "the access line")
    finally:
        server.stop()
    line = next(line for line in server.log_path.read_text().splitlines() if "plain" in line)
    # api.logs: time, level, message, the request's id as key=value.
    access = r"\S+Z info  GET /healthz\?plain 200 \(127\.0\.0\.1\) [0-9.]+ms request_id=[0-9a-f]{32}"
    assert re.fullmatch(access, line), line
