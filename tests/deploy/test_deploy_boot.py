"""The EC2 user data, run end to end on a booted Debian from a release file: cloud-init, systemd, supervisor and all.

No AWS account is reachable from here, so the instance is the nearest real
thing: a Debian bookworm root (``tests/deploy/base_root.sh``: minbase, with
systemd and cloud-init, built once under ``var/`` and copied per run) booted
with ``systemd-nspawn -b``. Its user data is what the CloudFormation template
would hand an instance, made from ``deploy/ec2/jetway.yaml`` itself (its
settings lines with this test's values, then ``deploy/ec2/user-data.sh``),
given to cloud-init through the NoCloud datasource. The release is built here
by ``release/build.sh`` (what ``make release`` runs) from this checkout's
HEAD, twice: the same code under two version labels, A and B, handed to the
instance as ``file://`` URLs on a read-only bind mount. ``REDIS_URL`` is a
redis-server this test starts.

Then, from the host: release A answers within the first-boot allowance (the
test's own, not a systemd-wide limit: the user data is part of cloud-final);
the production venv holds requirements.txt's packages and what they need,
nothing else, and the instance has no git, compiler or redis-server; the
master runs on the release's CPython venv and its workers on PyPy; a token
made with the CLI inside the instance writes and reads a document; a worker
killed with SIGKILL is replaced; after a reboot Jetway serves the same data;
the user data with release B under load is a rolling upgrade with no failed
request, every worker then naming B on ``/healthz``; the user data with A
again is a rollback, from disk, the same way; and the user data run a third
time with the same settings writes and restarts nothing.

What a container cannot show: ``/proc/sys`` is read-only in it, so the
kernel settings are written but not applied (user-data.sh says so and goes
on); the network is the host's. Runs only under ``make test-deploy``
(``JETWAY_TEST_DEPLOY=1``), which builds the base first.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
import requests

from tests.multinode import RedisProcess, data_args
from tests.support import ROOT, free_port, wait_until

pytestmark = pytest.mark.skipif(
    os.environ.get("JETWAY_TEST_DEPLOY") != "1", reason="boots a container: run by make test-deploy"
)
BASE = Path(os.environ.get("JETWAY_DEPLOY_BASE", ROOT / "var" / "deploy-base"))
RELEASES_IN_CONTAINER = "/srv/jetway-releases"
# The first boot installs Debian's packages and the release; ~1 minute here.
FIRST_BOOT_TIMEOUT = 600
# systemd in the container answering at all (not the whole boot: cloud-final is the user data).
BOOT_TIMEOUT = 120
SERVING_TIMEOUT = 120
REBOOTED = 133  # systemd-nspawn's exit status when the container asked for a reboot
# Runtime packages a server must not get: development and test tools.
DEV_ONLY = {"pytest", "hypothesis", "ruff", "redis", "selenium", "pyyaml", "openapi-spec-validator", "pytest-timeout"}
RELEASE_HEADER = "X-Jetway-Release"


class Container:
    """``systemd-nspawn -b`` of ``root``: booted, entered with nsenter, rebooted, stopped by pid."""

    def __init__(self, root: Path, releases: Path, log: Path) -> None:
        self.root = root
        self.releases = releases
        self.log = log
        self.process: Optional[subprocess.Popen] = None

    def boot(self) -> None:
        """Start it and wait for its systemd to answer; the services (cloud-init, supervisor) come on their own."""
        command = ["systemd-nspawn", "-D", str(self.root), "-b", "--register=no", "--keep-unit", "--quiet"]
        command += [f"--bind-ro={self.releases}:{RELEASES_IN_CONTAINER}"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._up, BOOT_TIMEOUT, "the container's systemd to answer")

    def _up(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log.read_text()[-3000:]
        state = self.run("systemctl", "is-system-running", check=False, timeout=10).stdout.strip()
        return state in ("initializing", "starting", "running", "degraded")

    def init_pid(self) -> int:
        assert self.process is not None
        pid = self.process.pid
        return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])

    def run(self, *command: str, check: bool = True, timeout: float = 120, env: Optional[dict] = None):
        """A command inside the container (its mount, pid and network namespaces)."""
        enter = ["nsenter", "--target", str(self.init_pid()), "--mount", "--uts", "--ipc", "--pid", "--net", "--"]
        if env:
            enter += ["env", *(f"{name}={value}" for name, value in env.items())]
        result = subprocess.run([*enter, *command], capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}: {result.stdout}{result.stderr}")
        return result

    def reboot(self) -> float:
        """Reboot; returns when the old boot had ended (time.monotonic())."""
        self.run("systemctl", "reboot", check=False)
        assert self.process is not None
        assert self.process.wait(BOOT_TIMEOUT) == REBOOTED
        down = time.monotonic()
        self.boot()
        return down

    def started(self, unit: str) -> float:
        """When ``unit`` became active, on time.monotonic()'s clock (CLOCK_MONOTONIC is the host's too)."""
        shown = self.run("systemctl", "show", unit, "-p", "ActiveEnterTimestampMonotonic").stdout
        return int(shown.strip().split("=")[1]) / 1e6

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # nspawn asks the container's systemd to power off
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def user_data(settings: dict) -> str:
    """What the template hands an instance: its settings lines (with ``settings``), then user-data.sh."""
    template = (ROOT / "deploy" / "ec2" / "jetway.yaml").read_text()
    match = re.search(r"- - !Sub \|\n((?: {18}.*\n|\n)+?) {16}- \|\n", template)
    assert match, "the settings part of the template's UserData"
    lines = [line[18:] for line in match.group(1).splitlines()]
    text = "\n".join(lines) + "\n"
    for name, value in settings.items():
        text = text.replace("${" + name + "}", value)
    rediss = "rediss://${Redis.PrimaryEndPoint.Address}:${Redis.PrimaryEndPoint.Port}/0"
    text = text.replace(rediss, settings["REDIS_URL"])
    assert "${" not in text, text
    return text + (ROOT / "deploy" / "ec2" / "user-data.sh").read_text()


def seed(root: Path, script: str) -> None:
    """cloud-init's NoCloud datasource with ``script`` as the user data."""
    nocloud = root / "var/lib/cloud/seed/nocloud"
    nocloud.mkdir(parents=True)
    (nocloud / "meta-data").write_text("instance-id: i-jetway-boot-test\nlocal-hostname: jetway-boot\n")
    (nocloud / "user-data").write_text(script)
    (root / "etc/cloud/cloud.cfg.d/99-jetway-boot-test.cfg").write_text(
        "datasource_list: [ NoCloud, None ]\n"
        "# A container has no SSH server and no locales package: nothing for those modules to do.\n"
        "ssh_genkeytypes: []\nlocale: C.UTF-8\n"
    )


def build_release(out: Path, version: str) -> Tuple[Path, str]:
    """``release/build.sh`` for HEAD under ``version``: the file and its sha256."""
    command = [str(ROOT / "release" / "build.sh"), "--version", version, "--out", str(out)]
    subprocess.run(command, check=True, env=_git_trusts_root())
    tarball = out / f"jetway-{version}.tar.gz"
    sha256 = (out / f"jetway-{version}.tar.gz.sha256").read_text().split()[0]
    return tarball, sha256


def _git_trusts_root() -> dict:
    """The environment, with git told the checkout is safe: make test-deploy runs as root (sudo) in a checkout
    someone else may own, where git refuses to work otherwise."""
    safe = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": str(ROOT)}
    return {**os.environ, **safe}


@pytest.fixture
def instance(tmp_path) -> Iterator[tuple]:
    assert (BASE / ".jetway-base-complete").exists(), f"no base root at {BASE}: run make test-deploy"
    head = ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"]
    commit = subprocess.run(head, capture_output=True, text=True, env=_git_trusts_root())
    label = commit.stdout.strip()
    releases_dir = tmp_path / "releases"
    started = time.monotonic()
    releases = {name: build_release(releases_dir, version) for name, version in (("A", label), ("B", f"{label}-b"))}
    built = time.monotonic() - started
    redis_port = free_port()
    redis_server = RedisProcess(tmp_path / "redis", redis_port, data_args(tmp_path / "redis", redis_port))
    root = tmp_path / "root"
    subprocess.run(["cp", "-a", str(BASE), str(root)], check=True)
    port = free_port()
    settings = {
        "JetwayPort": str(port),
        "VpcCidr": "10.0.0.0/16",
        "WriteReplicas": "0",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
    }
    scripts = {
        name: user_data(
            {**settings, "ReleaseUrl": f"file://{RELEASES_IN_CONTAINER}/{tarball.name}", "ReleaseSha256": sha256}
        )
        for name, (tarball, sha256) in releases.items()
    }
    seed(root, scripts["A"])
    container = Container(root, releases_dir, tmp_path / "console.log")
    try:
        redis_server.start()
        yield container, f"http://127.0.0.1:{port}", settings, releases, scripts, built
    finally:
        container.stop()
        redis_server.stop()
        shutil.rmtree(root, ignore_errors=True)  # ~400 MB once installed: not kept with pytest's last runs


@pytest.mark.timeout(FIRST_BOOT_TIMEOUT + 900)
def test_the_user_data_installs_a_release_on_a_booted_debian_and_upgrades_and_rolls_back(instance):
    container, base, settings, releases, scripts, built = instance
    version = {name: _version_of(tarball) for name, (tarball, _) in releases.items()}
    started = time.monotonic()
    container.boot()
    booted = time.monotonic() - started
    wait_until(lambda: _release(base) == version["A"], FIRST_BOOT_TIMEOUT, "release A to answer after the first boot")
    first_serving = time.monotonic() - started
    status = json.loads(container.run("cloud-init", "status", "--wait", "--format", "json", check=False).stdout or "{}")
    output = (container.root / "var/log/cloud-init-output.log").read_text()
    assert f"jetway: serving release {version['A']} on port {settings['JetwayPort']} (" in output, output[-3000:]
    steps = re.findall(r"^jetway: (installed \S+|serving).*\((\d+) s into the user data\)$", output, re.M)
    assert status.get("status") == "done", status

    packages = _runtime_only(container)
    master_exe, worker_exes = _interpreters(container)
    assert Path(master_exe).name.startswith("python3"), master_exe  # the release's master venv: Debian's CPython
    assert worker_exes and all("pypy" in exe for exe in worker_exes), worker_exes
    resident = _resident(container)

    # A token made with the CLI on the instance, as an operator would; a document through it.
    token = container.run(
        *("runuser", "-u", "jetway", "--", "env", "--chdir=/opt/jetway", f"REDIS_URL={settings['REDIS_URL']}"),
        *("/opt/jetway/current/venv/bin/python", "-m", "api", "keys", "create", "--name", "boot", "--scope", "admin"),
    )
    headers = {"Authorization": f"Bearer {token.stdout.strip()}", "Content-Type": "application/json"}
    body = b'{"booted":true}'
    assert requests.put(f"{base}/v1/boot/d1", data=body, headers=headers, timeout=10).status_code == 201
    assert requests.get(f"{base}/v1/boot/d1", headers=headers, timeout=10).content == body

    # A worker killed with SIGKILL is replaced by the master.
    workers = _workers(container)
    container.run("kill", "-KILL", str(workers[0]))
    wait_until(lambda: len(set(_workers(container)) - set(workers)) == 1, 30, "a new worker")
    assert requests.get(f"{base}/v1/boot/d1", headers=headers, timeout=10).status_code == 200

    # Reboot: supervisord comes back through systemd, Jetway serves the same data from the same release.
    started = time.monotonic()
    down = container.reboot()
    wait_until(lambda: _release(base) == version["A"], SERVING_TIMEOUT, "Jetway to answer after the reboot")
    after_reboot = time.monotonic() - started
    supervisor = container.started("supervisor")
    reboot_steps = (
        f"down in {down - started:.1f} s, supervisor started {supervisor - down:.1f} s later,"
        f" serving {started + after_reboot - supervisor:.1f} s after that"
    )
    assert requests.get(f"{base}/v1/boot/d1", headers=headers, timeout=10).content == body

    # Upgrade to B, then roll back to A: the user data again, under load.
    upgrade = _deploy(container, base, headers, scripts["B"], version["B"])
    assert "jetway: installed release" in upgrade["output"], upgrade["output"]
    rollback = _deploy(container, base, headers, scripts["A"], version["A"])
    assert "jetway: installed release" not in rollback["output"], "the rollback downloaded or installed again"
    kept = sorted(container.run("ls", "/opt/jetway/releases").stdout.split())
    assert kept == sorted(version.values()), kept

    # The user data a third time with the same settings: nothing written, nothing restarted.
    before = _workers(container)
    again = _run_user_data(container, scripts["A"])
    assert "jetway: wrote" not in again and "installed release" not in again, again
    assert _workers(container) == before, "the same settings restarted Jetway"

    size = releases["A"][0].stat().st_size
    with tarfile.open(releases["A"][0]) as tar:
        wheels = sorted(Path(name).name for name in tar.getnames() if name.endswith(".whl"))
    print(
        f"\nreleases A and B built in {built:.0f} s; A: {releases['A'][0].name}, {size / 1e6:.1f} MB,"
        f" {len(wheels)} wheels: {', '.join(wheels)}\n"
        f"booted to multi-user in {booted:.1f} s; first boot to release A answering"
        f" {first_serving:.1f} s (cloud-init: {status.get('status')}; user data: {steps}); after a reboot"
        f" {after_reboot:.1f} s ({reboot_steps})\n"
        f"production venv ({len(packages)}): {', '.join(sorted(packages))}\n"
        f"master on {master_exe}, workers on {', '.join(sorted(set(worker_exes)))}; resident after the first"
        f" boot, master and workers: {resident}\n"
        f"upgrade A -> B: user data {upgrade['seconds']:.1f} s, {upgrade['ok']} requests under load, 0 failed;"
        f" rollback B -> A: {rollback['seconds']:.1f} s, {rollback['ok']} requests, 0 failed"
    )


def _version_of(tarball: Path) -> str:
    return tarball.name[len("jetway-") : -len(".tar.gz")]


def _release(base: str) -> Optional[str]:
    """The release /healthz names, or None when nothing answers."""
    try:
        response = requests.get(f"{base}/healthz", timeout=2)
    except requests.RequestException:
        return None
    return response.headers.get(RELEASE_HEADER) if response.status_code == 200 else None


def _runtime_only(container: Container) -> Dict[str, str]:
    """The production venv holds requirements.txt and requirements-nodeps.txt, pinned, and what they need; no more.

    ``pip list --not-required`` lists what nothing installed depends on: each
    of those must be a requirement line, so every other package is there
    because a requirement needs it.
    """
    python = "/opt/jetway/current/venv/bin/python"
    # The venv's own directory: PyPy's built-in cffi, greenlet, hpy and readline are the interpreter's.
    site = container.run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    # The venv has no pip of its own: Debian's pip wheel, as the user data uses it.
    wheel = container.run("sh", "-c", "ls /usr/share/python-wheels/pip-*.whl").stdout.split()[-1]
    pip = [python, f"{wheel}/pip", "list", "--format=json", "--disable-pip-version-check", "--path", site]
    installed = {_name(p["name"]): p["version"] for p in json.loads(container.run(*pip).stdout)}
    roots = {_name(p["name"]) for p in json.loads(container.run(*pip, "--not-required").stdout)}
    pinned = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines() + (
        ROOT / "requirements-nodeps.txt"
    ).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and 'platform_python_implementation == "CPython"' not in line:
            name, pin = re.split(r"==", line.split(";")[0])
            pinned[_name(name.split("[")[0])] = pin.strip()
    assert {name: installed.get(name) for name in pinned} == pinned
    assert roots <= set(pinned), roots - set(pinned)  # no pip, no setuptools either
    assert not set(installed) & DEV_ONLY, set(installed) & DEV_ONLY
    for tool in ("git", "make", "gcc", "redis-server"):
        assert container.run("sh", "-c", f"command -v {tool}", check=False).returncode != 0, f"{tool} on a server"
    return installed


def _interpreters(container: Container) -> Tuple[str, List[str]]:
    """The executables (in the container) that Jetway's master and its workers run on."""
    master = container.run("supervisorctl", "pid", "jetway").stdout.strip()
    command = container.run("cat", f"/proc/{master}/cmdline").stdout.split("\0")
    assert command[0] == "/opt/jetway/current/master-venv/bin/python", command  # through current, as the workers
    exe = container.run("readlink", f"/proc/{master}/exe").stdout.strip()
    return exe, [container.run("readlink", f"/proc/{pid}/exe").stdout.strip() for pid in _workers(container)]


def _resident(container: Container) -> str:
    """VmRSS (VmHWM) of the master, then of each worker, in MiB."""
    master = container.run("supervisorctl", "pid", "jetway").stdout.strip()
    shown = []
    for pid in [master, *map(str, _workers(container))]:
        lines = container.run("cat", f"/proc/{pid}/status").stdout.splitlines()
        status = dict(line.split(":", 1) for line in lines if ":" in line)
        rss, hwm = (int(status[key].split()[0]) // 1024 for key in ("VmRSS", "VmHWM"))
        shown.append(f"{rss} ({hwm})")
    return ", ".join(shown) + " MiB"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run_user_data(container: Container, script: str) -> str:
    (container.root / "root/user-data-again.sh").write_text(script)
    result = container.run("bash", "/root/user-data-again.sh", timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def _deploy(container: Container, base: str, headers: dict, script: str, version: str) -> dict:
    """The user data with another release, under load; every worker replaced and naming ``version``."""
    workers = _workers(container)
    with _Load(f"{base}/v1/boot/d1", headers) as load:
        started = time.monotonic()
        output = _run_user_data(container, script)
        seconds = time.monotonic() - started
        time.sleep(0.5)
    assert load.ok > 50 and load.failures == [], (load.ok, load.failures[:5])
    assert not set(_workers(container)) & set(workers), "a worker from before the reload is still running"
    answers = {_release(base) for _ in range(20)}  # fresh connections: both workers' sockets
    assert answers == {version}, answers
    return {"output": output, "seconds": seconds, "ok": load.ok}


def _workers(container: Container) -> List[int]:
    """The pids (in the container) of Jetway's workers: the children of the master supervisord runs."""
    master = container.run("supervisorctl", "pid", "jetway").stdout.strip()
    children = container.run("cat", f"/proc/{master}/task/{master}/children").stdout.split()
    return sorted(int(pid) for pid in children)


class _Load:
    """GETs in a loop from 4 threads until the block ends, two on one keep-alive connection each,
    two on a fresh connection per request (the accept path a reload must keep open); counts what failed."""

    def __init__(self, url: str, headers: dict) -> None:
        self.url = url
        self.headers = headers
        self.ok = 0
        self.failures: List[str] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(n % 2 == 0,)) for n in range(4)]

    def __enter__(self) -> _Load:
        for thread in self.threads:
            thread.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self, keep_alive: bool) -> None:
        with requests.Session() as session:
            sent = 0
            while not self.stopping.is_set():
                sent += 1
                if sent % 200 == 0:
                    with self.lock:  # PyPy keeps dropped sockets until a collection (tests/support.py)
                        gc.collect()
                try:
                    get = session.get if keep_alive else requests.get
                    status = get(self.url, headers=self.headers, timeout=10).status_code
                    outcome = None if status == 200 else f"status {status}"
                except requests.RequestException as error:
                    outcome = f"{type(error).__name__}: {error}"
                with self.lock:
                    if outcome is None:
                        self.ok += 1
                    else:
                        self.failures.append(outcome)
