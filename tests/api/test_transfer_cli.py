"""``python -m api import|export`` against a running Jetway (api/transfer_cli.py)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, List

import pytest
import requests

from tests.support import ROOT, JetwayServer, feed_events, settled, wait_until

NDJSON = "application/x-ndjson"
COUNT = 24000


@pytest.fixture(scope="module")
def server(redis_server, tmp_path_factory) -> Iterator[JetwayServer]:
    jetway = JetwayServer(redis_server.url, tmp_path_factory.mktemp("transfer") / "jetway.log")
    try:
        yield jetway.start(["--workers", "1"])
    finally:
        jetway.stop()


def cli(server: JetwayServer, *args: str, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "api", *args, "--url", server.base]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def run_cli(server: JetwayServer, *args: str) -> subprocess.CompletedProcess:
    process = cli(server, *args)
    try:
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:  # timed out, or the test failed meanwhile: not left running
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def wrapped_lines(count: int, seed: int, pad: int = 0) -> List[bytes]:
    """``{"id":...,"doc":...}`` lines whose documents do not hold their id, with varied spacing."""
    rng = random.Random(seed)
    return [
        b'{"id":"i%07d","doc":{"n": %d,%s"t":"\\u00e9%s"}}\n' % (key, n, b" " * rng.randrange(3), b"x" * pad)
        for n, key in enumerate(rng.sample(range(10**7), count))
    ]


def bare_export(server: JetwayServer, collection: str) -> bytes:
    return requests.get(server.url(f"/v1/{collection}"), headers={"Accept": NDJSON}).content


@pytest.mark.slow
def test_an_export_imported_into_an_empty_collection_gives_the_same_documents(server, redis_client, tmp_path):
    source = tmp_path / "source.ndjson"
    source.write_bytes(b"".join(wrapped_lines(3000, 1)))
    loaded = run_cli(server, "import", "src", str(source), "--with-ids")
    assert loaded.returncode == 0, loaded.stderr
    assert b"imported 3,000 documents (3,000 created, 0 replaced)" in loaded.stderr
    assert b"docs/s" in loaded.stderr  # the bar
    dump = tmp_path / "dump.ndjson"
    exported = run_cli(server, "export", "src", str(dump))
    assert exported.returncode == 0, exported.stderr
    assert b"exported 3,000 documents" in exported.stderr and b"3000/3000" in exported.stderr
    assert dump.read_bytes() == b"".join(sorted(source.read_bytes().splitlines(keepends=True)))
    to_stdout = run_cli(server, "export", "src")
    assert to_stdout.stdout == dump.read_bytes()
    again = run_cli(server, "import", "dst", str(dump), "--with-ids")
    assert again.returncode == 0, again.stderr
    assert bare_export(server, "dst") == bare_export(server, "src")
    assert bare_export(server, "src").count(b"\n") == 3000
    assert not Path(str(dump) + ".jetway-import").exists()  # the state file goes once the server answered


def test_an_export_cut_short_resumes_after_its_last_whole_line(server, redis_client, tmp_path):
    source = tmp_path / "source.ndjson"
    source.write_bytes(b"".join(wrapped_lines(2000, 2)))
    assert run_cli(server, "import", "exp", str(source), "--with-ids").returncode == 0
    whole = tmp_path / "whole.ndjson"
    assert run_cli(server, "export", "exp", str(whole)).returncode == 0
    cut = tmp_path / "cut.ndjson"
    data = whole.read_bytes()
    cut.write_bytes(data[: random.Random(3).randrange(len(data) // 4, len(data) * 3 // 4)])  # mid-line
    resumed = run_cli(server, "export", "exp", str(cut), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert cut.read_bytes() == data


def test_refused_lines_go_to_the_refused_file_with_their_number_and_problem(server, redis_client, tmp_path):
    source = tmp_path / "mixed.ndjson"
    source.write_bytes(b'{"id":"a1","n":1}\n{"id": "a2", \n["no"]\n{"id":"a4"}\n')
    refused = tmp_path / "refused.ndjson"
    result = run_cli(server, "import", "mix", str(source), "--id", "/id", "--refused", str(refused))
    assert result.returncode == 3, result.stderr  # done, with refusals
    assert b"refused 2 lines" in result.stderr
    listed = [json.loads(line) for line in refused.read_text().splitlines()]
    assert [(r["line"], r["status"], r["text"]) for r in listed] == [(2, 400, '{"id": "a2", '), (3, 400, '["no"]')]
    assert requests.get(server.url("/v1/mix/a4")).status_code == 200


@pytest.mark.slow
def test_an_interrupted_import_resumed_writes_each_document_once(server, redis_client, tmp_path):
    # 12 MB: more than the kernel's socket buffers hold (~4 MB here), so the upload is cut mid-file.
    lines = wrapped_lines(COUNT, 4, pad=450)
    source = tmp_path / "many.ndjson"
    source.write_bytes(b"".join(lines))
    process = cli(server, "import", "many", str(source), "--with-ids")
    try:
        wait_until(lambda: feed_events(redis_client, "many") > 0, 30, "the import's first writes")
        # Redis holds the worker's writes: the upload stops mid-file, by back-pressure, for sure.
        redis_client.client_pause(5000, all=False)
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        redis_client.client_unpause()
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert b"--resume" in err
    state = Path(str(source) + ".jetway-import")
    assert state.exists()
    written = settled(lambda: feed_events(redis_client, "many"))
    assert 0 < written < COUNT
    refused = run_cli(server, "import", "many", str(source), "--with-ids")
    assert refused.returncode == 1 and b"--resume" in refused.stderr  # not started again by mistake
    resumed = run_cli(server, "import", "many", str(source), "--with-ids", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert b"skipped" in resumed.stderr
    assert feed_events(redis_client, "many") == COUNT  # each document written once
    assert bare_export(server, "many").count(b"\n") == COUNT
    assert not state.exists()
