#!/bin/bash
# Jetway on EC2: cloud-init user data for a Debian 12 (bookworm) instance.
#
# cloud-init runs it as root on first boot; it may be run again by hand, and
# then changes only what the settings changed: each step compares before it
# writes, and a service is reloaded only when something it reads changed.
#   1. pypy3, pypy3-venv, python3-venv, supervisor and curl from Debian (no git,
#      no compiler, no redis-server: Redis is REDIS_URL's);
#   2. the release: the file at JETWAY_RELEASE_URL (`make release`), checked
#      against JETWAY_RELEASE_SHA256, unpacked into JETWAY_DIR/releases/<version>,
#      its wheels installed with no package index into a PyPy venv there (the
#      workers) and a CPython one (the master); then JETWAY_DIR/current points
#      at it. The previous release stays for a rollback;
#   3. kernel and open-files tuning for many connections;
#   4. the settings in /etc/jetway/jetway.env, handed to supervisord by a
#      systemd drop-in, and the release's deploy/supervisor/jetway.conf;
#   5. a new release on a running Jetway: the workers replaced one at a time
#      (supervisorctl signal HUP); waits until every worker runs the release,
#      so a broken boot or upgrade shows in cloud-init's status (or the exit code).
# Another release (an upgrade, or a rollback to one kept on disk) is this
# script again with its URL and checksum. Settings come from the environment:
# deploy/ec2/jetway.yaml exports them in a few lines above this script; by hand:
# `sudo REDIS_URL=... JETWAY_RELEASE_URL=... JETWAY_RELEASE_SHA256=... bash user-data.sh`.
set -euo pipefail

: "${JETWAY_RELEASE_URL:?set JETWAY_RELEASE_URL to the release file (make release), https:// or file://}"
: "${JETWAY_RELEASE_SHA256:?set JETWAY_RELEASE_SHA256 to the sha256 of the release file (its .sha256 file)}"
: "${REDIS_URL:?set REDIS_URL, e.g. rediss://primary-endpoint:6379/0}"
JETWAY_HOST="${JETWAY_HOST:-0.0.0.0}"
JETWAY_PORT="${JETWAY_PORT:-8080}"
JETWAY_WORKERS="${JETWAY_WORKERS:-$(nproc)}"
JETWAY_TRUSTED_PROXIES="${JETWAY_TRUSTED_PROXIES:-}"
# Replicas that must have a write before it is answered (docs/operations.md, "Acknowledged writes").
JETWAY_WRITE_REPLICAS="${JETWAY_WRITE_REPLICAS:-0}"
JETWAY_DIR="${JETWAY_DIR:-/opt/jetway}"
JETWAY_USER="${JETWAY_USER:-jetway}"
JETWAY_LOG_DIR="${JETWAY_LOG_DIR:-/var/log/jetway}"
# Prefix for every file written under /etc; empty on a real machine
# (tests/deploy/test_deploy_ec2.py runs this script against a temp directory).
ETC="${JETWAY_SYSROOT:-}/etc"
RELEASES="$JETWAY_DIR/releases"
if ! [[ "$JETWAY_RELEASE_SHA256" =~ ^[0-9a-f]{64}$ ]]; then
  echo "jetway: JETWAY_RELEASE_SHA256 is not a sha256 (64 lowercase hex digits)" >&2
  exit 1
fi

restart_supervisor=0 # supervisord's environment or limits changed
update_program=0     # the program file changed
reload_workers=0     # only the release changed: a rolling reload will do

# put_file MODE PATH < content: write PATH only if its content differs.
# Succeeds when it wrote, fails when the file was already so.
put_file() {
  local mode="$1" path="$2" new
  new="$(mktemp)"
  cat >"$new"
  if [ -f "$path" ] && cmp -s "$new" "$path"; then
    rm -f "$new"
    return 1
  fi
  install -D -m "$mode" "$new" "$path"
  rm -f "$new"
  echo "jetway: wrote $path"
}

# --- 1. Debian packages, only those missing -------------------------------
missing=()
for package in pypy3 pypy3-venv python3-venv supervisor curl ca-certificates; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  # No translations, and no fsync per file: a first boot that dies half-way
  # is an instance the group replaces. 21 -> 15 s here (docs/deploy.md).
  apt-get update -qq -o Acquire::Languages=none
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-unsafe-io "${missing[@]}"
  echo "jetway: installed ${missing[*]} (${SECONDS} s into the user data)"
fi
id -u "$JETWAY_USER" >/dev/null 2>&1 ||
  useradd --system --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin "$JETWAY_USER"

# --- 2. the release ---------------------------------------------------------
# Owned by root and only read by JETWAY_USER, so the server cannot change its
# own code. A release directory is complete once its .installed file (the
# archive's checksum) exists; one with this checksum is used as it is.

# installed_release: the version of the complete release with the wanted checksum.
installed_release() {
  local marker
  for marker in "$RELEASES"/*/.installed; do
    if [ -f "$marker" ] && [ "$(cat "$marker")" = "$JETWAY_RELEASE_SHA256" ]; then
      basename "$(dirname "$marker")"
      return 0
    fi
  done
  return 1
}

# release_venv INTERPRETER RELEASE VENV WHEELS: RELEASE/VENV, a venv of INTERPRETER
# holding RELEASE/WHEELS. It is made where it runs (its scripts hold absolute
# paths), with no pip or setuptools of its own: Debian's pip wheel (the -venv
# packages need it) installs the wheels, all of them and nothing else (the
# build resolved them: --no-deps), with no index: nothing is fetched but the
# release itself. JETWAY_USER cannot write __pycache__ in a root-owned tree:
# the venv and the release's code are compiled once here, on every core, all
# but the packages' own tests (a third of their files).
release_venv() {
  local interpreter="$1" release="$2" venv="$2/$3" wheels="$2/$4" pip_wheels
  "$interpreter" -m venv --without-pip "$venv"
  pip_wheels=(/usr/share/python-wheels/pip-*.whl)
  "$venv/bin/python" "${pip_wheels[-1]}/pip" install -q --disable-pip-version-check --no-index --no-deps --no-compile "$wheels"/*.whl
  "$venv/bin/python" -m compileall -q -j 0 -x '/tests?/' "$venv/lib" "$release/api" "$release/handlers" "$release/cache" >/dev/null
}

# install_release: fetch, check, unpack and install; sets version.
install_release() {
  local incoming="$RELEASES/.incoming" tops target python site
  rm -rf "$incoming"
  install -d -m 0700 "$incoming"
  curl -fsSL --retry 5 --retry-connrefused -o "$incoming/release.tar.gz" "$JETWAY_RELEASE_URL"
  if ! echo "$JETWAY_RELEASE_SHA256  $incoming/release.tar.gz" | sha256sum --check --status --strict; then
    echo "jetway: $JETWAY_RELEASE_URL does not have the sha256 $JETWAY_RELEASE_SHA256" >&2
    rm -rf "$incoming"
    exit 1
  fi
  tar -xzf "$incoming/release.tar.gz" -C "$incoming" --no-same-owner --no-same-permissions
  tops=("$incoming"/jetway-*/)
  version="$(cat "${tops[0]}RELEASE" 2>/dev/null || true)"
  if [ "${#tops[@]}" != 1 ] || ! [[ "$version" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]]; then
    echo "jetway: $JETWAY_RELEASE_URL is not a release (make release)" >&2
    exit 1
  fi
  target="$RELEASES/$version"
  if [ "$(readlink "$JETWAY_DIR/current" || true)" = "releases/$version" ]; then
    echo "jetway: release $version is running with another checksum; give the new build another label" >&2
    exit 1
  fi
  rm -rf "$target" # an older build of this label, or a run interrupted half-way
  mv "${tops[0]}" "$target"
  rm -rf "$incoming"
  chmod -R go-w,a+rX "$target"
  # The workers' venv, on PyPy.
  release_venv pypy3 "$target" venv wheels
  python="$target/venv/bin/python"
  # The code is found through the venv (supervisord starts Jetway in JETWAY_DIR,
  # not in a release), and every path on sys.path resolved: a process started
  # through `current` keeps its release's code even once `current` moves on, and
  # a worker started after the move gets the new release's venv and code.
  site="$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  printf '%s\n%s\n' "$target" 'import os, sys; sys.path[:] = [os.path.realpath(p) if p else p for p in sys.path]' >"$site/jetway-release.pth"
  # The master's venv, on Debian's CPython: the master serves no request, so
  # PyPy's JIT buys it nothing, and CPython's image is under half PyPy's
  # (api/master_python.py). A release built before it had no master-wheels.
  if [ -d "$target/master-wheels" ]; then
    release_venv python3 "$target" master-venv master-wheels
  fi
  echo "$JETWAY_RELEASE_SHA256" >"$target/.installed"
  echo "jetway: installed release $version in $target (${SECONDS} s into the user data)"
}

install -d -m 0755 "$JETWAY_DIR" "$RELEASES"
version="$(installed_release)" || install_release
previous="$(readlink "$JETWAY_DIR/current" || true)"
if [ "$previous" != "releases/$version" ]; then
  # A new link renamed over the old one: `current` is never missing.
  ln -sfn "releases/$version" "$JETWAY_DIR/current.new"
  mv -T "$JETWAY_DIR/current.new" "$JETWAY_DIR/current"
  echo "jetway: current release $version (was ${previous#releases/})"
  reload_workers=1
fi

# --- 3. tuning for many connections ----------------------------------------
# The values of the classic shared-socket Twisted benchmark (a master and
# PyPy workers accepting on one socket, 4000 concurrent clients).
if put_file 0644 "$ETC/sysctl.d/60-jetway.conf" <<EOF; then
# Jetway (deploy/ec2/user-data.sh): many concurrent connections.
# Ceiling on a listening socket's accept queue: Jetway asks for 4096 per
# worker socket (api/sockets.py); without this the kernel cuts it to 4096 or,
# on older kernels, 128, and bursts of new connections are dropped.
net.core.somaxconn = 8192
# Connections still in the handshake (SYN received) kept per listener, so a
# burst of new clients waits in the queue instead of being dropped.
net.ipv4.tcp_max_syn_backlog = 8192
# Local ports for outgoing connections (to Redis, and anything else dialing
# out from here): about 64,000 instead of Debian's 28,000, ...
net.ipv4.ip_local_port_range = 1024 65535
# ... but never Jetway's own port, which that range now includes.
net.ipv4.ip_local_reserved_ports = ${JETWAY_PORT}
# Open files (sockets are files) for the whole system: 16 million, far above
# what the workers' 1048576 each can reach on an instance this size. Recent
# kernels default to more; this makes the ceiling explicit and the same on
# every kernel.
fs.file-max = 16777216
EOF
  if ! sysctl -q -p "$ETC/sysctl.d/60-jetway.conf"; then
    # Containers (systemd-nspawn, Docker) mount /proc/sys read-only: there the
    # host's kernel settings apply. Anywhere else a failure is a failure.
    [ ! -w /proc/sys/net/core/somaxconn ] || exit 1
    echo "jetway: kernel settings not applied: /proc/sys is read-only here (a container)"
  fi
fi
put_file 0644 "$ETC/security/limits.d/60-jetway.conf" <<'EOF' || true
# Jetway (deploy/ec2/user-data.sh): open files per process for login sessions
# (the admin CLI by hand). 1048576 is the benchmark's value and the kernel's
# per-process maximum (fs.nr_open). supervisord, a systemd service, ignores
# this file: its limit is LimitNOFILE in its drop-in.
*     soft  nofile  1048576
*     hard  nofile  1048576
root  soft  nofile  1048576
root  hard  nofile  1048576
EOF

# --- 4. settings, supervisor ------------------------------------------------
# The master's interpreter, through `current` like the workers'; none (the
# master on PyPy) for a release without a master venv, so a rollback to one
# restarts supervisord instead of leaving it a path that a restart cannot run.
master_python="$JETWAY_DIR/current/master-venv/bin/python"
[ -x "$master_python" ] || master_python=""
if put_file 0640 "$ETC/jetway/jetway.env" <<EOF; then
# Jetway's settings (see README.md) and the paths that
# deploy/supervisor/jetway.conf reads as %(ENV_...)s. Read by systemd for
# supervisord, whose processes inherit them. Written by user-data.sh.
JETWAY_DIR=${JETWAY_DIR}
JETWAY_USER=${JETWAY_USER}
JETWAY_LOG_DIR=${JETWAY_LOG_DIR}
JETWAY_HOST=${JETWAY_HOST}
JETWAY_PORT=${JETWAY_PORT}
JETWAY_WORKERS=${JETWAY_WORKERS}
JETWAY_TRUSTED_PROXIES=${JETWAY_TRUSTED_PROXIES}
JETWAY_WRITE_REPLICAS=${JETWAY_WRITE_REPLICAS}
REDIS_URL=${REDIS_URL}
JETWAY_MASTER_PYTHON=${master_python}
EOF
  restart_supervisor=1
fi
if put_file 0644 "$ETC/systemd/system/supervisor.service.d/jetway.conf" <<EOF; then
# Jetway (deploy/ec2/user-data.sh).
[Service]
# The settings and paths of /etc/supervisor/conf.d/jetway.conf.
EnvironmentFile=/etc/jetway/jetway.env
# Open files for supervisord and so for Jetway, which raises its soft limit
# to this hard one (systemd services do not read limits.d).
LimitNOFILE=1048576
EOF
  systemctl daemon-reload
  restart_supervisor=1
fi
[ -d "$JETWAY_LOG_DIR" ] || install -d -m 0755 "$JETWAY_LOG_DIR"
if put_file 0644 "$ETC/supervisor/conf.d/jetway.conf" <"$JETWAY_DIR/current/deploy/supervisor/jetway.conf"; then
  update_program=1
fi

# workers: the pids of the master's workers (none while supervisord has no master).
workers() {
  local master
  master="$(supervisorctl pid jetway 2>/dev/null || true)"
  [[ "$master" =~ ^[1-9][0-9]*$ ]] || return 0
  cat "/proc/$master/task/$master/children" 2>/dev/null || true
}

systemctl is-enabled --quiet supervisor || systemctl enable --quiet supervisor
replaced=""
if [ "$restart_supervisor" = 1 ]; then
  # supervisord reads its environment only when it starts. Stopping drains.
  systemctl restart supervisor
elif [ "$update_program" = 1 ]; then
  supervisorctl update # restarts jetway only if its program section changed
elif [ "$reload_workers" = 1 ]; then
  replaced="$(workers)"
  supervisorctl signal HUP jetway # new workers on the new release, no failed request
fi
systemctl is-active --quiet supervisor || systemctl start supervisor

# --- 5. serving this release? ---------------------------------------------
# /healthz names the release of the worker that answered; after a HUP, every
# worker from before has also gone (the master replaces them one at a time).
serving() {
  local pid
  curl -fsS -D - -o /dev/null "http://127.0.0.1:${JETWAY_PORT}/healthz" 2>/dev/null |
    tr -d '\r' | grep -qix "x-jetway-release: $version" || return 1
  for pid in $replaced; do
    ! grep -qw "$pid" <<<"$(workers)" || return 1
  done
}
for _ in $(seq 360); do
  if serving; then
    echo "jetway: serving release $version on port ${JETWAY_PORT} (${SECONDS} s into the user data)"
    # After a switch, keep this release and the one before it (for a rollback).
    [ "$reload_workers" = 1 ] || exit 0
    for dir in "$RELEASES"/*/; do
      case "$(basename "$dir")" in
      "$version" | "${previous#releases/}") ;;
      *) rm -rf "$dir" && echo "jetway: removed release $(basename "$dir")" ;;
      esac
    done
    exit 0
  fi
  sleep 0.5
done
echo "jetway: release $version not serving on port ${JETWAY_PORT} after 3 minutes; see ${JETWAY_LOG_DIR}/jetway.log" >&2
exit 1
