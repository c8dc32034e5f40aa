"""The EC2 user data, run end to end on a booted Debian: cloud-init, systemd, supervisor and all.

No AWS account is reachable from here, so the instance is the nearest real
thing: a Debian bookworm root (``tests/deploy/base_root.sh``: minbase, with
systemd and cloud-init, built once under ``var/`` and copied per run) booted
with ``systemd-nspawn -b``. Its user data is what the CloudFormation template
would hand an instance, made from ``deploy/ec2/jetway.yaml`` itself (its
settings lines with this test's values, then ``deploy/ec2/user-data.sh``),
given to cloud-init through the NoCloud datasource. ``JETWAY_REPO`` is a clone
of this checkout's HEAD; ``REDIS_URL`` a redis-server this test starts.

Then, from the host: Jetway answers on its port; a token made with the CLI
inside the instance writes and reads a document; a worker killed with
SIGKILL is replaced; ``supervisorctl signal HUP jetway`` under load fails no
request; after a reboot Jetway serves the same data again; and the user data
run a second time writes and restarts nothing.

What a container cannot show: ``/proc/sys`` is read-only in it, so the
kernel settings are written but not applied (user-data.sh says so and goes
on); the network is the host's. Runs only under ``make test-deploy``
(``JETWAY_TEST_DEPLOY=1``), which builds the base first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest
import requests

from tests.multinode import RedisProcess, data_args
from tests.support import ROOT, free_port, wait_until

pytestmark = pytest.mark.skipif(
    os.environ.get("JETWAY_TEST_DEPLOY") != "1", reason="boots a container: run by make test-deploy"
)
BASE = Path(os.environ.get("JETWAY_DEPLOY_BASE", ROOT / "var" / "deploy-base"))
SOURCE_IN_CONTAINER = "/srv/jetway-source"
FIRST_BOOT_TIMEOUT = 900
BOOT_TIMEOUT = 120
REBOOTED = 133  # systemd-nspawn's exit status when the container asked for a reboot


class Container:
    """``systemd-nspawn -b`` of ``root``: booted, entered with nsenter, rebooted, stopped by pid."""

    def __init__(self, root: Path, source: Path, log: Path) -> None:
        self.root = root
        self.source = source
        self.log = log
        self.process: Optional[subprocess.Popen] = None

    def boot(self) -> None:
        command = ["systemd-nspawn", "-D", str(self.root), "-b", "--register=no", "--keep-unit", "--quiet"]
        command += [f"--bind-ro={self.source}:{SOURCE_IN_CONTAINER}"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._booted, BOOT_TIMEOUT, "the container to boot")

    def _booted(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log.read_text()[-3000:]
        state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
        return state in ("running", "degraded")

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

    def reboot(self) -> None:
        self.run("systemctl", "reboot", check=False)
        assert self.process is not None
        assert self.process.wait(BOOT_TIMEOUT) == REBOOTED
        self.boot()

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
    """cloud-init's NoCloud datasource, and the host's registry settings (pip through this network's CA)."""
    nocloud = root / "var/lib/cloud/seed/nocloud"
    nocloud.mkdir(parents=True)
    (nocloud / "meta-data").write_text("instance-id: i-jetway-boot-test\nlocal-hostname: jetway-boot\n")
    (nocloud / "user-data").write_text(script)
    (root / "etc/cloud/cloud.cfg.d/99-jetway-boot-test.cfg").write_text(
        "datasource_list: [ NoCloud, None ]\n"
        "# A container has no SSH server and no locales package: nothing for those modules to do.\n"
        "ssh_genkeytypes: []\nlocale: C.UTF-8\n"
    )
    if Path("/etc/pip.conf").exists():
        shutil.copy("/etc/ssl/certs/ca-certificates.crt", root / "etc/jetway-host-ca.pem")
        (root / "etc/pip.conf").write_text("[global]\ncert = /etc/jetway-host-ca.pem\n")


@pytest.fixture
def instance(tmp_path) -> Iterator[tuple]:
    assert (BASE / ".jetway-base-complete").exists(), f"no base root at {BASE}: run make test-deploy"
    source = tmp_path / "source"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(source)], check=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    redis_port = free_port()
    redis_server = RedisProcess(tmp_path / "redis", redis_port, data_args(tmp_path / "redis", redis_port))
    root = tmp_path / "root"
    subprocess.run(["cp", "-a", str(BASE), str(root)], check=True)
    port = free_port()
    settings = {
        "JetwayRepo": f"file://{SOURCE_IN_CONTAINER}",
        "JetwayRef": commit.stdout.strip(),
        "JetwayPort": str(port),
        "VpcCidr": "10.0.0.0/16",
        "WriteReplicas": "0",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
    }
    seed(root, user_data(settings))
    container = Container(root, source, tmp_path / "console.log")
    try:
        redis_server.start()
        yield container, f"http://127.0.0.1:{port}", settings
    finally:
        container.stop()
        redis_server.stop()
        shutil.rmtree(root, ignore_errors=True)  # ~1 GB once installed: not kept with pytest's last runs


def test_the_user_data_brings_up_jetway_on_a_booted_debian(instance, tmp_path):
    container, base, settings = instance
    started = time.monotonic()
    container.boot()
    booted = time.monotonic() - started
    wait_until(lambda: _answers(base), FIRST_BOOT_TIMEOUT, "Jetway to answer after the first boot")
    first_serving = time.monotonic() - started
    status = json.loads(container.run("cloud-init", "status", "--format", "json", check=False).stdout or "{}")
    output = (container.root / "var/log/cloud-init-output.log").read_text()
    assert f"jetway: serving on port {settings['JetwayPort']}" in output, output[-3000:]

    # A token made with the CLI on the instance, as an operator would; a document through it.
    token = container.run(
        *("runuser", "-u", "jetway", "--", "env", "--chdir=/opt/jetway", f"REDIS_URL={settings['REDIS_URL']}"),
        *("/opt/jetway/.venv/bin/python", "-m", "api", "keys", "create", "--name", "boot", "--scope", "admin"),
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

    # A rolling reload under load fails no request.
    with _Load(base, headers) as load:
        time.sleep(1.0)
        container.run("supervisorctl", "signal", "HUP", "jetway")
        wait_until(lambda: not set(_workers(container)) & set(workers), 60, "every worker replaced")
        time.sleep(1.0)
    assert load.ok > 50 and load.failures == [], load.failures[:5]

    # Reboot: supervisord comes back through systemd, Jetway serves the same data.
    started = time.monotonic()
    container.reboot()
    wait_until(lambda: _answers(base), BOOT_TIMEOUT, "Jetway to answer after the reboot")
    after_reboot = time.monotonic() - started
    assert requests.get(f"{base}/v1/boot/d1", headers=headers, timeout=10).content == body

    # The user data a second time: nothing written, nothing restarted.
    script = (container.root / "var/lib/cloud/seed/nocloud/user-data").read_text()
    (container.root / "root/user-data-again.sh").write_text(script)
    before = _workers(container)
    again = container.run("bash", "/root/user-data-again.sh", timeout=300)
    assert "jetway: wrote" not in again.stdout + again.stderr, again.stdout + again.stderr
    assert _workers(container) == before, "the second run restarted Jetway"

    print(
        f"\nbooted to multi-user in {booted:.1f} s; first boot to Jetway answering {first_serving:.0f} s"
        f" (cloud-init status: {status.get('status', '?')}); after a reboot {after_reboot:.1f} s;"
        f" HUP under load: {load.ok} requests, 0 failed; second run of the user data: {again.stdout.strip()!r}"
    )


def _answers(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _workers(container: Container) -> List[int]:
    """The pids (in the container) of Jetway's workers: the children of the master supervisord runs."""
    master = container.run("supervisorctl", "pid", "jetway").stdout.strip()
    children = container.run("cat", f"/proc/{master}/task/{master}/children").stdout.split()
    return sorted(int(pid) for pid in children)


class _Load:
    """GETs in a loop from 4 threads until the block ends; counts what failed."""

    def __init__(self, base: str, headers: dict) -> None:
        self.url = f"{base}/v1/boot/d1"
        self.headers = headers
        self.ok = 0
        self.failures: List[str] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run) for _ in range(4)]

    def __enter__(self) -> _Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self) -> None:
        with requests.Session() as session:
            while not self.stopping.is_set():
                try:
                    status = session.get(self.url, headers=self.headers, timeout=10).status_code
                    outcome = None if status == 200 else f"status {status}"
                except requests.RequestException as error:
                    outcome = type(error).__name__
                with self.lock:
                    if outcome is None:
                        self.ok += 1
                    else:
                        self.failures.append(outcome)
