"""Clients generated from the running server's own ``/openapi.json``, used against it.

- Python: ``openapi-python-client`` (``.venv-clients``, CPython) generates a
  package; ``tests/clients/use_python_client.py`` calls every operation
  through it.
- TypeScript: ``openapi-typescript`` generates the types, ``openapi-fetch``
  is the client; ``tests/clients/use_ts_client.ts`` is type-checked against
  them by ``tsc`` (``noEmitOnError``: a type error fails before anything
  runs) and run by ``node``.

No generated line is edited, so a route or a document change that breaks a
generated client fails here. A generator warning is a defect of the document.
``make setup-clients`` (part of ``make test``) installs both toolchains.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.support import ROOT

CLIENTS = ROOT / "tests" / "clients"
CLIENTS_BIN = ROOT / ".venv-clients" / "bin"
NODE_MODULES = CLIENTS / "node_modules"
TIMEOUT = 120


def run(command: List[str], cwd: Path, env: Dict[str, str]) -> str:
    """Run a step; on failure the assertion shows everything it printed."""
    result = subprocess.run(
        command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=TIMEOUT
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{output}"
    return output


# A collection with a schema and indexes before the document is fetched, so each client gets its typed
# operations, and its list's query parameters (each client asks one query with in and one with cs, and counts
# the cs query's documents with Prefer: count=exact).
TYPED_SETTINGS = {
    "schema": {
        "type": "object",
        "required": ["email"],
        "properties": {
            "email": {"type": "string", "format": "email"},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    },
    "indexes": {
        "by_email_age": {
            "fields": [
                {"name": "email", "pointer": "/email", "type": "string"},
                {"name": "age", "pointer": "/age", "type": "number"},
            ]
        },
        "by_tags": {"fields": [{"name": "tags", "pointer": "/tags", "type": "string[]"}]},
    },
    "ttl": 3600,
}


@pytest.fixture
def spec_file(api, tmp_path: Path) -> Path:
    """The document exactly as the running server serves it, with collection ``typed``'s schema in it."""
    assert api.put_json("/v1/_collections/typed", json.dumps(TYPED_SETTINGS).encode()).status_code == 201
    time.sleep(0.3)  # every worker hears of the change
    response = api.get("/openapi.json")
    assert response.status_code == 200
    path = tmp_path / "openapi.json"
    path.write_bytes(response.content)
    return path


@pytest.fixture
def token(api) -> str:
    return api.session.headers["Authorization"].split(" ", 1)[1]


def test_python_client_generates_without_warnings_and_does_every_operation(api, spec_file, token, tmp_path):
    assert (CLIENTS_BIN / "openapi-python-client").exists(), "run `make setup-clients`"
    # The generator formats with ruff when it finds it on PATH; its dependency puts it there.
    path = {"PATH": f"{CLIENTS_BIN}:{os.environ['PATH']}"}
    package = tmp_path / "jetway_client"
    generate = [str(CLIENTS_BIN / "openapi-python-client"), "generate", "--path", str(spec_file)]
    generate += ["--config", str(CLIENTS / "openapi-python-client.yaml")]
    output = run([*generate, "--output-path", str(package), "--meta", "none"], tmp_path, path)
    assert "warning" not in output.lower(), output
    assert (package / "api" / "collections" / "get_documents.py").exists()
    assert (package / "api" / "typed" / "put_typed_document.py").exists()

    script = str(CLIENTS / "use_python_client.py")
    output = run([str(CLIENTS_BIN / "python"), script, api.server.base, token], tmp_path, {"PYTHONPATH": str(tmp_path)})
    assert "every operation answered as documented" in output


@pytest.mark.slow
def test_typescript_client_type_checks_and_does_every_operation(api, spec_file, token, tmp_path):
    assert (NODE_MODULES / ".bin" / "tsc").exists(), "run `make setup-clients`"
    project = tmp_path / "ts"
    project.mkdir()
    for name in ("package.json", "tsconfig.json", "use_ts_client.ts"):
        shutil.copy(CLIENTS / name, project / name)
    (project / "node_modules").symlink_to(NODE_MODULES)
    bin_dir = NODE_MODULES / ".bin"
    output = run([str(bin_dir / "openapi-typescript"), str(spec_file), "-o", "schema.d.ts"], project, {})
    assert "warn" not in output.lower(), output
    # `webhooks` and `$defs` are empty by nature; a schema or a response must never be.
    types = (project / "schema.d.ts").read_text().splitlines()
    empty = [line for line in types if "Record<string, never>" in line and not line.startswith("export type ")]
    assert not empty, f"object types with no members: {empty}"

    run([str(bin_dir / "tsc"), "-p", "tsconfig.json"], project, {})
    output = run(["node", "out/use_ts_client.js", api.server.base, token], project, {})
    assert "every operation answered as documented" in output


def test_every_operation_has_a_readable_operation_id(spec_file):
    operations = [
        operation
        for item in json.loads(spec_file.read_bytes())["paths"].values()
        for method, operation in item.items()
        if method in ("get", "head", "put", "post", "patch", "delete")
    ]
    ids = [operation["operationId"] for operation in operations]
    assert len(ids) == len(set(ids)) == len(operations)
    # Letters and digits: a collection's own operations carry its name (putTypedDocument).
    assert all(operation_id.isalnum() and operation_id[0].islower() for operation_id in ids), ids
    assert "putTypedDocument" in ids
