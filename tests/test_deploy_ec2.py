"""deploy/ec2: the user data and the CloudFormation template.

No AWS here, so two kinds of checks:

- The template (also cfn-lint clean in ``make lint``) is read as data: it
  carries user-data.sh verbatim, and the settings that matter are what
  deploy/README.md says (timeouts, health check, TLS, failover, who may
  reach whom).
- user-data.sh runs for real, as root would run it, but with the system
  commands that change a machine (apt-get, useradd, git, make, sysctl,
  systemctl, supervisorctl, curl) replaced by stubs that log their calls, and
  every /etc file written under a temp directory (JETWAY_SYSROOT). A second
  run with the same settings must write no file and call nothing that
  changes anything; new code must be a rolling reload, new settings a
  supervisord restart.
"""

from __future__ import annotations

import os
import subprocess
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
  git)
    if [ "$1" = clone ]; then
      mkdir -p "$last/.git" && cp -r "$STUB_SOURCE/deploy" "$last/" && echo none >"$last/.git/stub-head"
      exit 0
    fi
    dir="$2"; shift 2
    case "$1" in
      fetch) echo "$STUB_REMOTE_COMMIT" >"$dir/.git/stub-fetched" ;;
      rev-parse) [ "$2" = HEAD ] && cat "$dir/.git/stub-head" || cat "$dir/.git/stub-fetched" ;;
      checkout) echo "$last" >"$dir/.git/stub-head" ;;
    esac ;;
  make)
    dir="$2"
    if [ ! -e "$dir/.venv" ]; then
      mkdir -p "$dir/.venv/bin" && ln -s "$0" "$dir/.venv/bin/python"
      touch "$STUB_STATE/enabled-redis-server"  # make setup installs Debian's redis-server
    fi ;;
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
STUBBED = ["dpkg-query", "apt-get", "id", "useradd", "git", "make", "sysctl", "systemctl", "supervisorctl", "curl"]
# Calls that only look, and `make setup`, which decides for itself that there is nothing to do.
LOOKING = ("dpkg-query ", "id ", "git -C", "make ", "python ", "systemctl is-enabled", "systemctl is-active", "curl ")


class Machine:
    """A temp directory standing in for an instance; runs user-data.sh on it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.sysroot = base / "root"
        self.jetway_dir = base / "opt" / "jetway"
        self.log = base / "calls.log"
        state, stubs = base / "state", base / "bin"
        state.mkdir()
        stubs.mkdir()
        (stubs / "stub").write_text(STUB)
        (stubs / "stub").chmod(0o755)
        for name in STUBBED:
            (stubs / name).symlink_to(stubs / "stub")
        self.env = {
            "PATH": f"{stubs}:/usr/bin:/bin",
            "HOME": str(base),
            "STUB_LOG": str(self.log),
            "STUB_STATE": str(state),
            "STUB_SOURCE": str(ROOT),
            "STUB_REMOTE_COMMIT": "1111111",
            "JETWAY_SYSROOT": str(self.sysroot),
            "JETWAY_DIR": str(self.jetway_dir),
            "JETWAY_LOG_DIR": str(base / "log"),
            "JETWAY_REPO": "https://git.example.invalid/jetway.git",
            "JETWAY_REF": "v1",
            "JETWAY_WORKERS": "2",
            "JETWAY_TRUSTED_PROXIES": "10.0.0.0/16",
            "REDIS_URL": "rediss://master.jetway.example.invalid:6379/0",
        }

    def run(self, **changes: str) -> List[str]:
        """Run user-data.sh; returns the stubbed calls it made."""
        self.env.update(changes)
        self.log.write_text("")
        result = subprocess.run(
            ["bash", str(USER_DATA)], env=self.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return self.log.read_text().splitlines()

    def files(self) -> Dict[str, Tuple[bytes, int, int]]:
        """Every file under /etc: its content, mode and modification time."""
        found = {}
        for path in sorted(self.sysroot.rglob("*")):
            if path.is_file():
                status = path.stat()
                found[str(path.relative_to(self.sysroot))] = (path.read_bytes(), status.st_mode, status.st_mtime_ns)
        return found

    def etc(self, path: str) -> str:
        return (self.sysroot / "etc" / path).read_text()


def _changing(calls: List[str]) -> List[str]:
    """The calls that change something: all but LOOKING ones, and a git checkout."""
    return [call for call in calls if not call.startswith(LOOKING) or ("checkout" in call and call.startswith("git "))]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_the_first_run_installs_tunes_and_starts_jetway_under_supervisor(machine):
    calls = machine.run()
    assert "apt-get install -y -qq git make curl ca-certificates supervisor" in calls
    assert f"git clone --quiet https://git.example.invalid/jetway.git {machine.jetway_dir}" in calls
    assert f"git -C {machine.jetway_dir} checkout --quiet --detach 1111111" in calls
    assert f"make -C {machine.jetway_dir} --no-print-directory setup" in calls
    assert "systemctl disable --now --quiet redis-server" in calls
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
    assert (machine.sysroot / "etc/jetway/jetway.env").stat().st_mode & 0o777 == 0o640  # it may hold a password
    drop_in = machine.etc("systemd/system/supervisor.service.d/jetway.conf")
    assert "EnvironmentFile=/etc/jetway/jetway.env" in drop_in and "LimitNOFILE=1048576" in drop_in
    program = machine.etc("supervisor/conf.d/jetway.conf")
    assert program == (ROOT / "deploy/supervisor/jetway.conf").read_text()


def test_a_second_run_with_the_same_settings_changes_nothing(machine):
    machine.run()
    before = machine.files()
    calls = machine.run()
    assert machine.files() == before  # not one file rewritten, not even touched
    assert _changing(calls) == []
    assert f"make -C {machine.jetway_dir} --no-print-directory setup" in calls  # make finds nothing to do


def test_new_code_is_a_rolling_reload_and_new_settings_restart_supervisord(machine):
    machine.run()
    calls = machine.run(STUB_REMOTE_COMMIT="2222222")
    assert _changing(calls) == [
        f"git -C {machine.jetway_dir} checkout --quiet --detach 2222222",
        "supervisorctl signal HUP jetway",
    ]
    calls = machine.run(REDIS_URL="rediss://elsewhere.example.invalid:6379/0")
    assert _changing(calls) == ["systemctl restart supervisor"]
    assert "REDIS_URL=rediss://elsewhere.example.invalid:6379/0" in machine.etc("jetway/jetway.env")


def test_user_data_stops_at_once_without_its_settings(machine):
    del machine.env["REDIS_URL"]
    result = subprocess.run(["bash", str(USER_DATA)], env=machine.env, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "set REDIS_URL" in result.stderr
    assert not machine.log.exists() or machine.log.read_text() == ""
    assert not os.path.exists(machine.sysroot)
