"""deploy/supervisor: the program files, run by a real supervisord.

Each mode gets its own supervisord, started here and stopped by its pid, with
the repository's program file included as it is and its ``%(ENV_...)s``
names pointing at a temp directory. Under a steady client load:

- a worker killed with SIGKILL is replaced and service goes on;
- the zero-failure way to put new code in place fails no request: the
  master's rolling reload (``supervisorctl signal HUP jetway``), and in
  fcgi mode ``supervisorctl restart`` of one worker at a time;
- a whole-program ``supervisorctl restart`` stops everything before it
  starts anything, so it is NOT zero-failure on one machine: the tests pin
  that it comes back and that what fails in between is refused or reset
  connections only, never an error response, and print how much failed.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Optional, Set

import pytest
import requests

from api.master import DEFAULT_GC_ENVIRONMENT
from tests.support import ROOT, SteadyClient, failure_kind, free_port, wait_until

DEPLOY = ROOT / "deploy" / "supervisor"
WORKERS = 2
GRACE = 3
# process_name in jetway-fcgi.conf
FCGI_NAMES = [f"jetway:jetway-{n}" for n in range(WORKERS)]

SUPERVISORD_CONF = """\
[unix_http_server]
file={dir}/supervisor.sock

[supervisord]
nodaemon=true
logfile={dir}/supervisord.log
pidfile={dir}/supervisord.pid
childlogdir={dir}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{dir}/supervisor.sock

[include]
files={program}
"""


def _kernel_state(pid: int) -> str:
    """Each thread's state and what it waits in (``/proc``: R running, S sleeping, D in the kernel uninterruptibly)."""
    threads = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        threads.append(f"{task.name} {state} {(task / 'wchan').read_text() or '-'}")
    return "; ".join(threads)


class Supervisor:
    """A supervisord running one of deploy/supervisor's files."""

    def __init__(self, directory: Path, program: Path, redis_url: str) -> None:
        self.directory = directory
        self.program = program
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.conf = directory / "supervisord.conf"
        self.process: Optional[subprocess.Popen] = None
        self.seen: Set[int] = set()  # every Jetway pid seen, to check none is left
        # JETWAY_DIR as user-data.sh lays it out (current -> a release with its
        # venv); the release here is this checkout: its .venv, its code on
        # PYTHONPATH (a real release's venv finds its code through a .pth file).
        install = directory / "jetway"
        (install / "releases" / "checkout").mkdir(parents=True)
        (install / "releases" / "checkout" / "venv").symlink_to(ROOT / ".venv")
        (install / "current").symlink_to("releases/checkout")
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            # The file's placeholders: what /etc/jetway/jetway.env sets on EC2.
            "JETWAY_DIR": str(install),
            "JETWAY_LOG_DIR": str(directory),
            "JETWAY_USER": pwd.getpwuid(os.getuid()).pw_name,
            # Jetway's own settings, inherited by the processes.
            "JETWAY_HOST": "127.0.0.1",
            "JETWAY_PORT": str(self.port),
            "JETWAY_WORKERS": str(WORKERS),
            "JETWAY_GRACE": str(GRACE),
            "REDIS_URL": redis_url,
            "JETWAY_ACCESS_LOG": "off",
            "JETWAY_AUTH": "off",  # authorization is not what this module is about
            "JETWAY_WARM_UP": "0",  # nor the warm-up (tests/process/test_warm_up.py), which lengthens each restart
        }

    def start(self) -> Supervisor:
        self.conf.write_text(SUPERVISORD_CONF.format(dir=self.directory, program=self.program))
        with open(self.directory / "supervisord.out", "ab") as out:
            self.process = subprocess.Popen(
                [_tool("supervisord"), "-n", "-c", str(self.conf)],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.wait_healthy(30, f"jetway under supervisord (see {self.directory})")
        wait_until(self.all_running, 30, "supervisor to see every process RUNNING (startsecs)")
        return self

    def wait_healthy(self, seconds: float, what: str) -> None:
        """``healthy`` within ``seconds``; else a failure that says what supervisord and the logs said then."""
        try:
            wait_until(self.healthy, seconds, what)
        except TimeoutError as timeout:
            raise AssertionError(f"{timeout}\n{self.diagnosis()}") from None

    def diagnosis(self) -> str:
        """supervisord's status of its processes, where each Jetway process is (its kernel state and, from
        SIGUSR2, its threads' stacks, written to its log) and the end of each log here: why a wait failed."""
        try:
            status = self.ctl("status", check=False)
            parts = [status]
            for pid in (int(found) for found in re.findall(r"\bpid (\d+)", status)):
                try:
                    parts.append(f"pid {pid}: {_kernel_state(pid)}")
                    os.kill(pid, signal.SIGUSR2)  # the stacks, even of a stuck reactor (api.signals.dump_stacks_on)
                except OSError as gone:
                    parts.append(f"pid {pid}: {gone}")
            time.sleep(1)
            for log in [*sorted(self.directory.glob("*.log")), self.directory / "supervisord.out"]:
                if log.exists():
                    parts += [f"--- {log.name}", *log.read_text(errors="replace").splitlines()[-40:]]
            return "\n".join(parts)
        except Exception as error:  # the diagnosis must not hide the failure it explains
            return f"(no diagnosis: {error!r})"

    def all_running(self) -> bool:
        lines = self.ctl("status", check=False).splitlines()
        return bool(lines) and all(line.split()[1] == "RUNNING" for line in lines)

    def healthy(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"supervisord exited with {self.process.returncode}; see {self.directory}")
        return requests.get(self.base + "/healthz", timeout=1).status_code == 200

    def ctl(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(
            [_tool("supervisorctl"), "-c", str(self.conf), *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert result.returncode == 0 or not check, f"supervisorctl {' '.join(args)}: {result.stdout}{result.stderr}"
        return result.stdout

    def pid(self, name: str) -> int:
        pid = int(self.ctl("pid", name))
        assert pid > 0, f"{name} is not running"
        self.seen.add(pid)
        return pid

    def children(self, pid: int) -> List[int]:
        found = sorted(int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        self.seen.update(found)
        return found

    def url(self, path: str) -> str:
        return self.base + path

    def stop(self) -> None:
        """Stop supervisord by its pid (it stops Jetway first); then nothing of ours may be left."""
        if self.process is None:
            return
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(60)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(10)
        finally:
            self.process = None
            left = [pid for pid in self.seen if _is_jetway(pid)]
            for pid in left:
                os.kill(pid, signal.SIGKILL)
        assert left == [], f"still running after supervisord stopped: {left}"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is missing: `make setup` installs Debian's supervisor package"
    return path


def _is_jetway(pid: int) -> bool:
    try:
        return b"api" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def _connection_level(outcome: str) -> bool:
    """Refused or reset before an answer: the client knows the request was not served and may retry it."""
    return failure_kind(outcome) in ("refused", "reset")


@pytest.fixture(scope="class")
def master_mode(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    supervisor = Supervisor(tmp_path_factory.mktemp("sv-master"), DEPLOY / "jetway.conf", redis_server.url)
    try:
        supervisor.start()
        wait_until(lambda: len(supervisor.children(supervisor.pid("jetway"))) == WORKERS, 20, "both workers")
        yield supervisor
    finally:
        supervisor.stop()


@pytest.fixture(scope="class")
def fcgi_mode(redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    supervisor = Supervisor(tmp_path_factory.mktemp("sv-fcgi"), DEPLOY / "jetway-fcgi.conf", redis_server.url)
    try:
        supervisor.start()
        yield supervisor
    finally:
        supervisor.stop()


def _put_and_get(supervisor: Supervisor) -> None:
    body = b'{"deployed":"under supervisor"}'
    put = requests.put(
        supervisor.url("/v1/things/d1"), data=body, headers={"Content-Type": "application/json"}, timeout=10
    )
    assert put.status_code in (200, 201), put.text
    got = requests.get(supervisor.url("/v1/things/d1"), timeout=10)
    assert (got.status_code, got.content) == (200, body)


class TestMasterMode:
    """supervisor runs the master (deploy/supervisor/jetway.conf)."""

    def test_serves_and_logs_where_supervisor_rotates(self, master_mode, redis_client):
        assert "RUNNING" in master_mode.ctl("status", "jetway")
        _put_and_get(master_mode)
        log = (master_mode.directory / "jetway.log").read_text()
        assert f"serving on http://127.0.0.1:{master_mode.port} with {WORKERS} workers" in log
        stdin = os.readlink(f"/proc/{master_mode.pid('jetway')}/fd/0")
        assert stdin.startswith("pipe:"), stdin  # supervisord's, never written to

    def test_a_worker_killed_with_sigkill_is_replaced(self, master_mode, redis_client):
        master = master_mode.pid("jetway")
        victim = master_mode.children(master)[0]
        with SteadyClient(master_mode.base) as client:
            os.kill(victim, signal.SIGKILL)
            wait_until(
                lambda: len(master_mode.children(master)) == WORKERS and victim not in master_mode.children(master),
                15,
                "a new worker",
            )
        client.report("master mode, SIGKILL of a worker")
        assert master_mode.pid("jetway") == master  # the master replaced it; supervisor did not need to
        assert client.ok > 0
        # A request the killed worker held may fail; queued ones wait for its replacement.
        assert len(client.failures) <= 4, client.failures

    @pytest.mark.slow
    def test_supervisorctl_signal_hup_reloads_every_worker_with_no_failed_request(self, master_mode, redis_client):
        master = master_mode.pid("jetway")
        before = set(master_mode.children(master))
        with SteadyClient(master_mode.base) as client:
            master_mode.ctl("signal", "HUP", "jetway")
            wait_until(lambda: not before & set(master_mode.children(master)), 30, "every worker to be replaced")
            wait_until(lambda: len(master_mode.children(master)) == WORKERS, 10, "all slots filled")
        client.report("master mode, supervisorctl signal HUP")
        assert master_mode.pid("jetway") == master
        assert client.ok > 0
        assert client.failures == []

    @pytest.mark.slow
    def test_supervisorctl_restart_comes_back_but_refuses_in_between(self, master_mode, redis_client):
        """Not zero-failure: stop drains the old master, and the port is closed until the new one binds."""
        old = master_mode.pid("jetway")
        with SteadyClient(master_mode.base) as client:
            started = time.monotonic()
            master_mode.ctl("restart", "jetway")
            took = time.monotonic() - started
            wait_until(lambda: len(master_mode.children(master_mode.pid("jetway"))) == WORKERS, 20, "new workers")
            time.sleep(0.5)
            since = time.monotonic()
        line = client.report(f"master mode, supervisorctl restart ({took:.1f}s)")
        assert master_mode.pid("jetway") != old
        assert client.ok > 0
        assert [outcome for _, outcome in client.failures if not _connection_level(outcome)] == [], line
        assert [at for at, _ in client.failures if at > since] == [], "still failing after the restart"
        _put_and_get(master_mode)


class TestFcgiMode:
    """supervisor binds the socket, workers adopt fd 0 (deploy/supervisor/jetway-fcgi.conf)."""

    def test_serves_and_a_worker_killed_with_sigkill_is_replaced(self, fcgi_mode, redis_client):
        _put_and_get(fcgi_mode)
        victim = fcgi_mode.pid(FCGI_NAMES[0])
        assert os.readlink(f"/proc/{victim}/fd/0") != "/dev/null"
        with SteadyClient(fcgi_mode.base) as client:
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: fcgi_mode.pid(FCGI_NAMES[0]) not in (0, victim), 15, "supervisor to start a new worker")
        client.report("fcgi mode, SIGKILL of a worker")
        assert client.ok > 0
        assert len(client.failures) <= 4, client.failures
        assert (fcgi_mode.directory / "jetway-0.log").exists()

    def test_workers_get_the_gc_settings_the_master_gives_its_own(self, fcgi_mode, redis_client):
        for name in FCGI_NAMES:
            environ = Path(f"/proc/{fcgi_mode.pid(name)}/environ").read_bytes().split(b"\0")
            for setting, value in DEFAULT_GC_ENVIRONMENT.items():
                assert f"{setting}={value}".encode() in environ, (name, setting)

    @pytest.mark.slow
    def test_supervisorctl_restart_one_worker_at_a_time_fails_no_request(self, fcgi_mode, redis_client):
        before = {name: fcgi_mode.pid(name) for name in FCGI_NAMES}
        with SteadyClient(fcgi_mode.base) as client:
            for name in FCGI_NAMES:
                fcgi_mode.ctl("restart", name)  # returns once the new one has been up startsecs
        client.report("fcgi mode, supervisorctl restart of each worker in turn")
        assert all(fcgi_mode.pid(name) != before[name] for name in FCGI_NAMES)
        assert client.ok > 0
        assert client.failures == []

    @pytest.mark.slow
    def test_group_restart_comes_back_but_refuses_in_between(self, fcgi_mode, redis_client):
        """Not zero-failure: every worker stops first, and the socket closes with the last one."""
        with SteadyClient(fcgi_mode.base) as client:
            fcgi_mode.ctl("restart", "jetway:*")
            fcgi_mode.wait_healthy(20, "the workers to be back")
            time.sleep(0.5)
            since = time.monotonic()
        line = client.report("fcgi mode, supervisorctl restart jetway:*")
        assert client.ok > 0
        assert [outcome for _, outcome in client.failures if not _connection_level(outcome)] == [], line
        assert [at for at, _ in client.failures if at > since] == [], "still failing after the restart"
