"""Outside tools hold the server to HTTP and to its own OpenAPI document.

- schemathesis (a schema-based fuzzer) generates requests from the running
  server's ``/openapi.json`` (boundary values, random values and chains of
  calls) and checks that every status, content type, header and body it gets
  back is the one documented for that operation;
- REDbot (an HTTP linter) reads a document, a compressed one and a list page
  and finds neither an error nor a warning with the default cache policy.

Both run from ``.venv-clients`` (``requirements-clients.txt``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
import requests

from tests.support import ROOT, JetwayServer

TOOLS = ROOT / ".venv-clients" / "bin"


@pytest.fixture(scope="module")
def fuzzed_server(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    """A Jetway with authorization on whose change-feed long poll waits at most a second.

    Its /openapi.json says so (``wait`` maximum 1), so the fuzzer's long polls
    each take a second at most, not the default maximum of a minute each.
    """
    env = {"JETWAY_FEED_MAX_WAIT": "1"}
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("fuzz") / "jetway.log", env=env, auth=True)
    try:
        yield server.start()
    finally:
        server.stop()


# The fuzzer's own run is allowed 300 s below; schemathesis 4.10 took 119 s
# of the suite's default 120 while the full suite ran beside it on this
# 2-core machine (4.20's ~1,550 requests: 23-33 s on a loaded one).
@pytest.mark.slow
@pytest.mark.timeout(360)
def test_the_fuzzer_finds_no_response_the_document_does_not_describe(api, fuzzed_server, tmp_path):
    token = fuzzed_server.make_token("fuzzer", "admin")
    # A 503 is a deliberate, documented refusal here, never a crash: the
    # fuzzer may give a collection settings asking writes to reach replicas
    # (``write_replicas``) and then write to it, and this Redis has none, so
    # the write is refused 503 not-replicated (in one CI run of 1,616 tests it
    # did). Every other 5xx is still a server error.
    config = tmp_path / "schemathesis.toml"
    config.write_text('[checks.not_a_server_error]\nexpected-statuses = ["2xx", "3xx", "4xx", "503"]\n')
    # An NDJSON body (the import's) is text to send as it is: schemathesis has no serializer of its own for it.
    (tmp_path / "ndjson_hooks.py").write_text(
        'import schemathesis\nschemathesis.serializer.alias("application/x-ndjson", "text/plain")\n'
    )
    result = subprocess.run(
        [
            str(TOOLS / "schemathesis"),
            "--config-file",
            str(config),
            "run",
            fuzzed_server.url("/openapi.json"),
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "status_code_conformance,content_type_conformance,response_headers_conformance,"
            "response_schema_conformance,not_a_server_error",
            "--max-examples",
            "15",
            # One worker: with two threads, Hypothesis's lambda descriptions (ast.parse) raced in CPython 3.11's
            # AST validator ("AST constructor recursion depth mismatch"), an error of the fuzzer's own.
            "--workers",
            "1",
            "--seed",
            os.environ.get("JETWAY_FUZZ_SEED", "1"),  # another seed, to look further: docs/testing.md
            "--report",
            "ndjson",
            "--report-ndjson-path",
            "events.ndjson",
        ],
        cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": "ndjson_hooks"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    events = tmp_path / "events.ndjson"
    if result.returncode != 0 or " passed" not in output:
        said = [line for line in fuzzed_server.log_path.read_text().splitlines() if '"level": "info"' not in line]
        server = "\n".join(said[-20:]) or "(the server logged nothing above info)"
        pytest.fail(f"{_failed_checks(events)}\n\n{server}\n\n{_failures_first(output)}")


def _failed_checks(events: Path, limit: int = 4000) -> str:
    """Each check that did not pass, from the fuzzer's event log: its operation, the request and the answer.

    The fuzzer's own output lists them too, after its progress; an operation
    that ended in an error of the fuzzer's is named here with the answers it
    had (schemathesis 4.10 once counted one "failed" and showed nothing else:
    its issue #4209, fixed in 4.20.3).
    """
    found = []
    for finished in _scenarios(events):
        recorder = finished["recorder"]
        interactions = recorder.get("interactions") or {}
        if finished.get("status") in ("failure", "error"):
            statuses = sorted(str((i.get("response") or {}).get("status_code", "none")) for i in interactions.values())
            found.append(f"{finished['phase']} {recorder['label']}: {finished['status']}, answers {' '.join(statuses)}")
        for case_id, checks in (recorder.get("checks") or {}).items():
            for check in checks:
                if check.get("status") != "success":
                    interaction = interactions.get(case_id, {})
                    found.append(
                        f"{finished['phase']} {recorder['label']}: {json.dumps(check)[:800]}\n"
                        f"  request: {_described(interaction.get('request'))}\n"
                        f"  response: {_described(interaction.get('response'))}"
                    )
    if not found:
        return "(no failed check in the fuzzer's event log)"
    return "\n".join(found)[:limit]


def _scenarios(events: Path) -> Iterator[Dict[str, Any]]:
    """Each operation's test as the fuzzer's event log ends it (``ScenarioFinished``); none without a log."""
    for line in events.read_text().splitlines() if events.exists() else []:
        finished = json.loads(line).get("ScenarioFinished")
        if finished:
            yield finished


def _described(message: Any) -> str:
    """A recorded request or response, its body (base64 in the log) cut short."""
    if not message:
        return "none"
    body = message.get("body") or message.get("content") or {}
    if isinstance(body, dict) and "$base64" in body:
        body = base64.b64decode(body["$base64"])[:300]
    shown = {key: value for key, value in message.items() if key not in ("body", "content")}
    return f"{json.dumps(shown)[:600]} body {body!r:.300}"


def _failures_first(output: str, limit: int = 6000) -> str:
    """The fuzzer's FAILURES section (the request that failed and how), then its summary.

    The whole output's tail held only the warnings and the summary in one CI
    run, so the failed case itself was never seen. Hypothesis also warns of
    every large repr it makes (two lines each); those lines are left out.
    """
    lines = [line.rstrip() for line in output.splitlines() if not _hypothesis_repr_warning(line)]
    failures = _section(lines, "FAILURES")
    summary = _section(lines, "SUMMARY")
    if not failures:
        return "\n".join(lines)[-limit:]
    return "\n".join(failures)[: limit * 3 // 4] + "\n...\n" + "\n".join(summary)[-limit // 4 :]


def _section(lines: list[str], title: str) -> list[str]:
    """The lines from the ``=== title ===`` rule to the next rule, or none."""
    starts = [at for at, line in enumerate(lines) if line.startswith("=") and f" {title} " in line]
    if not starts:
        return []
    ends = [at for at in range(starts[0] + 1, len(lines)) if lines[at].startswith("====")]
    return lines[starts[0] : ends[0] if ends else len(lines)]


def _hypothesis_repr_warning(line: str) -> bool:
    return "HypothesisWarning: Generating overly large repr" in line or "self.__representation = repr_call(" in line


@pytest.fixture(scope="module")
def open_server(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    """A Jetway without authorization: the linter sends no token."""
    server = JetwayServer(redis_server.url, tmp_path_factory.mktemp("lint") / "jetway.log")
    try:
        yield server.start(["--workers", "1"])
    finally:
        server.stop()


def lint(url: str) -> list:
    """REDbot's notes on ``url`` that are errors or warnings, as ``(level, summary)``."""
    result = subprocess.run(
        [str(TOOLS / "redbot"), "-o", "har", url], capture_output=True, text=True, timeout=120, check=True
    )
    entries = json.loads(result.stdout)["log"]["entries"]
    notes = [note for entry in entries for note in entry.get("_red_messages", [])]
    assert notes, result.stdout[-2000:]  # REDbot said something: it did look
    return [(note["level"], note["summary"]) for note in notes if note["level"].lower() not in ("good", "info")]


def test_the_linter_finds_nothing_wrong_with_documents_and_pages(open_server, redis_client):
    items = [{"id": n, "name": f"user {n}", "email": f"u{n}@example.com"} for n in range(150)]
    documents = {"small": b'{"a":1}', "large": json.dumps({"items": items}).encode()}
    for doc_id, body in documents.items():
        written = requests.put(
            open_server.url(f"/v1/lint/{doc_id}"), data=body, headers={"Content-Type": "application/json"}, timeout=10
        )
        assert written.status_code == 201
    for path in ("/v1/lint/small", "/v1/lint/large", "/v1/lint?limit=10"):
        assert lint(open_server.url(path)) == [], path
