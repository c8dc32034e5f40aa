"""The bearer token a load test sends, wherever it comes from.

In order: ``JETWAY_TOKEN`` if set; else a token made with the admin CLI
(``python -m api keys create``) when this Jetway has one; else none, and the
load test sends no ``Authorization`` header (a Jetway without authorization).
The CLI talks to Redis directly, so it is run with the Redis the server uses.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PYTHON = ROOT / ".venv" / "bin" / "python"
SCOPES = ("read:*", "write:*")
CLI_TIMEOUT = 60


class TokenError(RuntimeError):
    """The admin CLI exists but failed to make a token; the message says why."""


def has_keys_cli(python: str) -> bool:
    """True when ``python -m api keys --help`` succeeds (authorization exists)."""
    if not Path(python).exists():
        return False
    result = subprocess.run(
        [python, "-m", "api", "keys", "--help"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=CLI_TIMEOUT,
        check=False,
    )
    return result.returncode == 0


def create(python: str, redis_url: Optional[str], name: str) -> str:
    """A new token with read and write on every collection: the CLI's last line."""
    command = [python, "-m", "api", "keys", "create", "--name", name]
    for scope in SCOPES:
        command += ["--scope", scope]
    # JETWAY_KEY_ARGS adds options of `keys create` (say, a --rate).
    command += shlex.split(os.environ.get("JETWAY_KEY_ARGS", ""))
    result = subprocess.run(
        command, cwd=ROOT, env=_cli_env(redis_url), capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False
    )
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        raise TokenError(f"`{' '.join(command[1:6])} …` failed ({result.returncode}): {result.stderr.strip()}")
    return lines[-1]


def revoke(python: str, redis_url: Optional[str], name: str) -> None:
    """Revoke a token this load test made; a failure here is not worth failing over."""
    subprocess.run(
        [python, "-m", "api", "keys", "revoke", name],
        cwd=ROOT,
        env=_cli_env(redis_url),
        capture_output=True,
        timeout=CLI_TIMEOUT,
        check=False,
    )


@dataclass(frozen=True)
class Resolved:
    """A token (or None), where it came from, and its name if made here."""

    token: Optional[str]
    source: str
    made_as: Optional[str]

    def headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def resolve(python: str, redis_url: Optional[str], given: str = "") -> Resolved:
    """The token to send (``given`` if any, as from ``JETWAY_TOKEN``), and where it came from."""
    if given.strip():
        return Resolved(given.strip(), "given (JETWAY_TOKEN)", None)
    if not has_keys_cli(python):
        return Resolved(None, f"none: {python} -m api keys is not available", None)
    name = f"loadtest-{int(time.time())}-{os.getpid()}"
    return Resolved(create(python, redis_url, name), f"made with the admin CLI as {name!r}", name)


def default_redis_url(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """``REDIS_URL``, else the private Redis of ``make run`` if it is there."""
    if environ.get("REDIS_URL"):
        return environ["REDIS_URL"]
    private = ROOT / "var" / "redis.sock"
    return f"unix://{private}" if private.exists() else None


def _cli_env(redis_url: Optional[str]) -> dict:
    env = dict(os.environ)
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env
