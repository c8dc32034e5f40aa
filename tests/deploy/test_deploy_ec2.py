"""deploy/ec2: the user data and the CloudFormation template.

No AWS here, so two kinds of checks:

- The template (also cfn-lint clean in ``make lint``) is read as data: it
  carries user-data.sh verbatim, and the settings that matter are what
  deploy/README.md says (timeouts, health check, TLS, failover, who may
  reach whom).
- user-data.sh runs for real, as root would run it, on a small release file
  made here (the layout ``release/build.sh`` makes), but with the system
  commands that change a machine (apt-get, useradd, pypy3 and the venv's
  python, sysctl, systemctl, supervisorctl, curl) replaced by stubs that log
  their calls, and every /etc file written under a temp directory
  (JETWAY_SYSROOT). A second run with the same settings must write no file
  and call nothing that changes anything; another release must be a rolling
  reload with the previous one kept, a rollback to it no download at all, a
  bad checksum nothing installed, new settings a supervisord restart.
  ``tests/deploy/test_deploy_boot.py`` does the same with nothing stubbed.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import yaml

from api.config import Settings
from tests.support import ROOT

USER_DATA = ROOT / "deploy" / "ec2" / "user-data.sh"
TEMPLATE = ROOT / "deploy" / "ec2" / "jetway.yaml"


class _CloudFormationLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short tags (!Ref, !Sub, ...) read as their long forms."""


def _short_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {"Ref" if suffix == "Ref" else f"Fn::{suffix}": value}


_CloudFormationLoader.add_multi_constructor("!", _short_tag)


@pytest.fixture(scope="module")
def resources() -> Dict[str, Any]:
    return yaml.load(TEMPLATE.read_text(), Loader=_CloudFormationLoader)["Resources"]


def _properties(resources: Dict[str, Any], name: str) -> Dict[str, Any]:
    return resources[name]["Properties"]


def test_the_template_carries_user_data_sh_verbatim(resources):
    launch = _properties(resources, "LaunchTemplate")["LaunchTemplateData"]
    settings, script = launch["UserData"]["Fn::Base64"]["Fn::Join"][1]
    assert script == USER_DATA.read_text(), (
        "deploy/ec2/jetway.yaml's UserData differs from deploy/ec2/user-data.sh: "
        "paste the script into the second part of the Fn::Join, indented like the lines around it"
    )
    assert "export REDIS_URL='rediss://${Redis.PrimaryEndPoint.Address}" in settings["Fn::Sub"]
    assert "JETWAY_WRITE_REPLICAS='${WriteReplicas}'" in settings["Fn::Sub"]


def test_the_balancer_closes_idle_connections_before_jetway_and_checks_readyz(resources):
    attributes = {a["Key"]: a["Value"] for a in _properties(resources, "LoadBalancer")["LoadBalancerAttributes"]}
    assert int(attributes["idle_timeout.timeout_seconds"]) < Settings().keepalive_timeout
    target_group = _properties(resources, "TargetGroup")
    assert target_group["HealthCheckPath"] == "/readyz"
    assert _properties(resources, "Instances")["HealthCheckType"] == "ELB"


def test_redis_fails_over_and_requires_tls(resources):
    redis = _properties(resources, "Redis")
    assert redis["AutomaticFailoverEnabled"] is True and redis["MultiAZEnabled"] is True
    assert redis["NumCacheClusters"] >= 2
    assert redis["TransitEncryptionEnabled"] is True


def test_only_the_balancer_reaches_the_instances_and_only_the_instances_reach_redis(resources):
    def sources(group: str) -> List[Any]:
        return [
            rule.get("SourceSecurityGroupId", rule.get("CidrIp"))
            for rule in _properties(resources, group)["SecurityGroupIngress"]
        ]

    assert sources("InstanceSecurityGroup") == [{"Ref": "BalancerSecurityGroup"}]
    assert sources("RedisSecurityGroup") == [{"Ref": "InstanceSecurityGroup"}]
    assert _properties(resources, "LaunchTemplate")["LaunchTemplateData"]["SecurityGroupIds"] == [
        {"Fn::GetAtt": "InstanceSecurityGroup.GroupId"}
    ]
    assert _properties(resources, "Redis")["SecurityGroupIds"] == [{"Fn::GetAtt": "RedisSecurityGroup.GroupId"}]


# --- user-data.sh against stubbed system commands ---

STUB = r"""#!/bin/bash
# A stand-in for a command that changes the machine: logs the call, keeps
# just enough state in $STUB_STATE for the script's checks to see its effect.
name="$(basename "$0")"
echo "$name $*" >>"$STUB_LOG"
last="${!#}"
case "$name" in
  dpkg-query) [ -e "$STUB_STATE/pkg-$last" ] && printf 'install ok installed' ;;
  apt-get)
    if [ "$1" = install ]; then
      for arg in "$@"; do
        case "$arg" in -* | install) ;; *) touch "$STUB_STATE/pkg-$arg" ;; esac
      done
      # Debian's supervisor package enables and starts its service.
      touch "$STUB_STATE/enabled-supervisor" "$STUB_STATE/active-supervisor"
    fi ;;
  id) [ -e "$STUB_STATE/user-$last" ] && echo 999 ;;
  useradd) touch "$STUB_STATE/user-$last" ;;
  curl)
    # A download (-o FILE file://PATH) copies; anything else is the health
    # check, answered with the release that `current` points at.
    if [ "$4" = --retry-connrefused ]; then cp "${last#file://}" "$6"
    else printf 'HTTP/1.1 200 OK\r\nX-Jetway-Release: %s\r\n\r\n' "$(cat "$JETWAY_DIR/current/RELEASE")"; fi ;;
  pypy3 | python3) mkdir -p "$last/bin" && ln -s "$0" "$last/bin/python" ;;  # pypy3 (python3) -m venv DIR
  python)
    # The venv's python: -c asks for its site-packages.
    if [ "$1" = -c ]; then site="$(dirname "$(dirname "$0")")/site-packages"; mkdir -p "$site"; echo "$site"; fi ;;
  systemctl)
    case "$1" in
      is-enabled) [ -e "$STUB_STATE/enabled-$last" ] ;;
      is-active) [ -e "$STUB_STATE/active-$last" ] ;;
      enable) touch "$STUB_STATE/enabled-$last" ;;
      disable) rm -f "$STUB_STATE/enabled-$last" "$STUB_STATE/active-$last" ;;
      start | restart) touch "$STUB_STATE/active-$last" ;;
    esac ;;
esac
"""
STUBBED = ["dpkg-query", "apt-get", "id", "useradd", "pypy3", "python3", "sysctl", "systemctl", "supervisorctl", "curl"]
# Calls that only look: packages, users, services, the health check, the master's pid, the venv's paths.
LOOKING = ("dpkg-query ", "id ", "systemctl is-enabled", "systemctl is-active", "curl -fsS ", "supervisorctl pid ")
LOOKING_PYTHON = "python -c "


def release_file(directory: Path, version: str, marker: str = "", master: bool = True) -> Tuple[str, str]:
    """A release as ``release/build.sh`` lays it out (no real wheels); its file:// URL and sha256.
    ``master``: with the master's wheels (a release built before them has none)."""
    path = directory / f"jetway-{version}.tar.gz"
    members = {
        "RELEASE": f"{version}\n",
        "requirements.txt": (ROOT / "requirements.txt").read_text(),
        "requirements-nodeps.txt": (ROOT / "requirements-nodeps.txt").read_text(),
        "deploy/supervisor/jetway.conf": (ROOT / "deploy/supervisor/jetway.conf").read_text(),
        "api/__init__.py": marker,
        "wheels/placeholder.whl": "",
    }
    if master:
        members["master-wheels/placeholder.whl"] = ""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"jetway-{version}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return f"file://{path}", hashlib.sha256(buffer.getvalue()).hexdigest()


class Machine:
    """A temp directory standing in for an instance; runs user-data.sh on it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.sysroot = base / "root"
        self.jetway_dir = base / "opt" / "jetway"
        self.log = base / "calls.log"
        state, stubs, releases = base / "state", base / "bin", base / "releases"
        for directory in (state, stubs, releases):
            directory.mkdir()
        (stubs / "stub").write_text(STUB)
        (stubs / "stub").chmod(0o755)
        for name in STUBBED:
            (stubs / name).symlink_to(stubs / "stub")
        self.releases = {version: release_file(releases, version) for version in ("v1", "v2", "v3")}
        self.releases["old"] = release_file(releases, "old", master=False)
        url, sha256 = self.releases["v1"]
        self.env = {
            "PATH": f"{stubs}:/usr/bin:/bin",
            "HOME": str(base),
            "STUB_LOG": str(self.log),
            "STUB_STATE": str(state),
            "JETWAY_SYSROOT": str(self.sysroot),
            "JETWAY_DIR": str(self.jetway_dir),
            "JETWAY_LOG_DIR": str(base / "log"),
            "JETWAY_RELEASE_URL": url,
            "JETWAY_RELEASE_SHA256": sha256,
            "JETWAY_WORKERS": "2",
            "JETWAY_TRUSTED_PROXIES": "10.0.0.0/16",
            "REDIS_URL": "rediss://master.jetway.example.invalid:6379/0",
        }

    def run(self, **changes: str) -> List[str]:
        """Run user-data.sh; returns the stubbed calls it made."""
        result = self.attempt(**changes)
        assert result.returncode == 0, result.stdout + result.stderr
        return self.log.read_text().splitlines()

    def attempt(self, **changes: str) -> subprocess.CompletedProcess:
        self.env.update(changes)
        self.log.write_text("")
        return subprocess.run(
            ["bash", str(USER_DATA)], env=self.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )

    def deploy(self, version: str) -> List[str]:
        url, sha256 = self.releases[version]
        return self.run(JETWAY_RELEASE_URL=url, JETWAY_RELEASE_SHA256=sha256)

    def files(self) -> Dict[str, Tuple[bytes, int, int]]:
        """Every file under /etc and JETWAY_DIR: its content, mode and modification time."""
        found = {}
        for top in (self.sysroot, self.jetway_dir):
            for path in sorted(top.rglob("*")):
                if path.is_file():
                    status = path.stat()
                    found[str(path)] = (path.read_bytes(), status.st_mode, status.st_mtime_ns)
        return found

    def etc(self, path: str) -> str:
        return (self.sysroot / "etc" / path).read_text()

    def current(self) -> str:
        return os.readlink(self.jetway_dir / "current")

    def installed(self) -> List[str]:
        return sorted(path.name for path in (self.jetway_dir / "releases").iterdir())


def _changing(calls: List[str]) -> List[str]:
    """The calls that change something: all but the LOOKING ones."""
    return [call for call in calls if not call.startswith(LOOKING) and not call.startswith(LOOKING_PYTHON)]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_the_first_run_installs_the_release_tunes_and_starts_jetway_under_supervisor(machine):
    calls = machine.run()
    packages = "pypy3 pypy3-venv python3-venv supervisor curl ca-certificates"
    assert f"apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-unsafe-io {packages}" in calls
    assert not [call for call in calls if call.startswith(("git ", "make ")) or "redis-server" in call]
    release = machine.jetway_dir / "releases" / "v1"
    assert machine.current() == "releases/v1"
    assert (release / ".installed").read_text().strip() == machine.env["JETWAY_RELEASE_SHA256"]
    assert f"pypy3 -m venv --without-pip {release}/venv" in calls
    assert f"python3 -m venv --without-pip {release}/master-venv" in calls  # the master's, on CPython
    pip = "/pip install -q --disable-pip-version-check --no-index --no-deps --no-compile"
    installs = [call for call in calls if pip in call]  # Debian's pip wheel, the venvs have none
    assert len(installs) == 2
    for install, wheels in zip(installs, ("wheels", "master-wheels")):
        placeholder = re.escape(f"{release}/{wheels}/placeholder.whl")
        assert re.fullmatch(rf"python /usr/share/python-wheels/pip-\S+\.whl{pip} {placeholder}", install)
    assert not [call for call in calls if "requirements-dev" in call]
    pth = (release / "venv" / "site-packages" / "jetway-release.pth").read_text().splitlines()
    assert pth[0] == str(release) and pth[1].startswith("import os, sys; sys.path[:] = [os.path.realpath(p)")
    assert f"sysctl -q -p {machine.sysroot}/etc/sysctl.d/60-jetway.conf" in calls
    assert calls.index("systemctl daemon-reload") < calls.index("systemctl restart supervisor")
    sysctl = machine.etc("sysctl.d/60-jetway.conf")
    for setting in ("net.core.somaxconn = 8192", "net.ipv4.tcp_max_syn_backlog = 8192", "fs.file-max = 16777216"):
        assert setting in sysctl
    assert "net.ipv4.ip_local_port_range = 1024 65535" in sysctl
    assert "net.ipv4.ip_local_reserved_ports = 8080" in sysctl
    assert "*     hard  nofile  1048576" in machine.etc("security/limits.d/60-jetway.conf")
    env = machine.etc("jetway/jetway.env")
    assert "REDIS_URL=rediss://master.jetway.example.invalid:6379/0" in env.splitlines()
    assert f"JETWAY_DIR={machine.jetway_dir}" in env.splitlines()
    assert "JETWAY_WRITE_REPLICAS=0" in env.splitlines()  # unless the template says 1
    assert f"JETWAY_MASTER_PYTHON={machine.jetway_dir}/current/master-venv/bin/python" in env.splitlines()
    assert (machine.sysroot / "etc/jetway/jetway.env").stat().st_mode & 0o777 == 0o640  # it may hold a password
    drop_in = machine.etc("systemd/system/supervisor.service.d/jetway.conf")
    assert "EnvironmentFile=/etc/jetway/jetway.env" in drop_in and "LimitNOFILE=1048576" in drop_in
    program = machine.etc("supervisor/conf.d/jetway.conf")
    assert program == (ROOT / "deploy/supervisor/jetway.conf").read_text()  # the release's copy


def test_a_second_run_with_the_same_settings_changes_nothing(machine):
    machine.run()
    before = machine.files()
    calls = machine.run()
    assert machine.files() == before  # not one file rewritten, not even touched
    assert _changing(calls) == []  # no download, no install, no reload


def test_another_release_is_a_rolling_reload_and_keeps_the_previous_for_a_rollback(machine):
    machine.run()
    calls = machine.deploy("v2")
    assert machine.current() == "releases/v2" and machine.installed() == ["v1", "v2"]
    assert "supervisorctl signal HUP jetway" in calls
    assert "systemctl restart supervisor" not in calls and "supervisorctl update" not in calls
    # The rollback: the kept release, switched to with no download and no install.
    calls = machine.deploy("v1")
    assert machine.current() == "releases/v1" and machine.installed() == ["v1", "v2"]
    assert _changing(calls) == ["supervisorctl signal HUP jetway"]
    # A third release: the one before it stays, the older one goes.
    machine.deploy("v3")
    assert machine.current() == "releases/v3" and machine.installed() == ["v1", "v3"]


def test_a_release_without_a_master_venv_runs_its_master_on_pypy_and_a_switch_to_it_restarts(machine):
    """A release built before the master's wheels: no master venv, and no JETWAY_MASTER_PYTHON that a
    restart of its master could not run; switching to or from it is a supervisord restart, not a HUP."""
    machine.deploy("old")
    assert not (machine.jetway_dir / "releases" / "old" / "master-venv").exists()
    assert "JETWAY_MASTER_PYTHON=" in machine.etc("jetway/jetway.env").splitlines()
    calls = machine.deploy("v1")
    assert "systemctl restart supervisor" in calls and "supervisorctl signal HUP jetway" not in calls
    master = f"JETWAY_MASTER_PYTHON={machine.jetway_dir}/current/master-venv/bin/python"
    assert master in machine.etc("jetway/jetway.env").splitlines()
    calls = machine.deploy("old")  # the rollback
    assert _changing(calls) == ["systemctl restart supervisor"]
    assert "JETWAY_MASTER_PYTHON=" in machine.etc("jetway/jetway.env").splitlines()


def test_a_release_whose_checksum_differs_is_not_installed(machine):
    machine.run()
    _, sha256 = machine.releases["v2"]
    result = machine.attempt(JETWAY_RELEASE_URL=machine.releases["v3"][0], JETWAY_RELEASE_SHA256=sha256)
    assert result.returncode != 0 and "does not have the sha256" in result.stderr
    assert machine.current() == "releases/v1" and machine.installed() == ["v1"]
    assert "supervisorctl signal HUP jetway" not in machine.log.read_text()


def test_new_settings_restart_supervisord(machine):
    machine.run()
    calls = machine.run(REDIS_URL="rediss://elsewhere.example.invalid:6379/0")
    assert _changing(calls) == ["systemctl restart supervisor"]
    assert "REDIS_URL=rediss://elsewhere.example.invalid:6379/0" in machine.etc("jetway/jetway.env")


@pytest.mark.parametrize("setting", ["REDIS_URL", "JETWAY_RELEASE_URL", "JETWAY_RELEASE_SHA256"])
def test_user_data_stops_at_once_without_its_settings(machine, setting):
    del machine.env[setting]
    result = subprocess.run(["bash", str(USER_DATA)], env=machine.env, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and f"set {setting}" in result.stderr
    assert not machine.log.exists() or machine.log.read_text() == ""
    assert not os.path.exists(machine.sysroot) and not os.path.exists(machine.jetway_dir)
