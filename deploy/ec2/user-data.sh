#!/bin/bash
# Jetway on EC2: cloud-init user data for a Debian 12 (bookworm) instance.
#
# cloud-init runs it as root on first boot; it may be run again by hand with
# the same settings, and then changes nothing: each step compares before it
# writes, and a service is reloaded only when something it reads changed.
#   1. git, make, curl and supervisor from Debian;
#   2. Jetway at JETWAY_REF in JETWAY_DIR, installed with `make setup`, the
#      same install step `make run` uses (PyPy, the .venv);
#   3. kernel and open-files tuning for many connections;
#   4. the settings in /etc/jetway/jetway.env, handed to supervisord by a
#      systemd drop-in, and the supervisor program deploy/supervisor/jetway.conf;
#   5. waits until Jetway answers, so a broken boot shows in cloud-init's status.
# Settings come from the environment: deploy/ec2/jetway.yaml exports them in a
# few lines above this script; by hand: `sudo REDIS_URL=... JETWAY_REPO=... bash user-data.sh`.
set -euo pipefail

: "${JETWAY_REPO:?set JETWAY_REPO to the git URL of the Jetway repository}"
: "${REDIS_URL:?set REDIS_URL, e.g. rediss://primary-endpoint:6379/0}"
JETWAY_REF="${JETWAY_REF:-main}"
JETWAY_HOST="${JETWAY_HOST:-0.0.0.0}"
JETWAY_PORT="${JETWAY_PORT:-8080}"
JETWAY_WORKERS="${JETWAY_WORKERS:-$(nproc)}"
JETWAY_TRUSTED_PROXIES="${JETWAY_TRUSTED_PROXIES:-}"
# Replicas that must have a write before it is answered (README, "Acknowledged writes").
JETWAY_WRITE_REPLICAS="${JETWAY_WRITE_REPLICAS:-0}"
JETWAY_DIR="${JETWAY_DIR:-/opt/jetway}"
JETWAY_USER="${JETWAY_USER:-jetway}"
JETWAY_LOG_DIR="${JETWAY_LOG_DIR:-/var/log/jetway}"
# Prefix for every file written under /etc; empty on a real machine
# (tests/test_deploy_ec2.py runs this script against a temp directory).
ETC="${JETWAY_SYSROOT:-}/etc"

restart_supervisor=0 # supervisord's environment or limits changed
update_program=0     # the program file changed
reload_workers=0     # only the code changed: a rolling reload will do

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
for package in git make curl ca-certificates supervisor; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
id -u "$JETWAY_USER" >/dev/null 2>&1 ||
  useradd --system --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin "$JETWAY_USER"

# --- 2. the code, and `make setup` ------------------------------------------
# Owned by root and only read by JETWAY_USER, so the server cannot change
# its own code. Pin JETWAY_REF to a tag or commit: a branch that moved is a
# new deploy, done here with a rolling reload.
[ -d "$JETWAY_DIR/.git" ] || git clone --quiet "$JETWAY_REPO" "$JETWAY_DIR"
git -C "$JETWAY_DIR" fetch --quiet origin "$JETWAY_REF"
wanted="$(git -C "$JETWAY_DIR" rev-parse FETCH_HEAD)"
if [ "$(git -C "$JETWAY_DIR" rev-parse HEAD)" != "$wanted" ]; then
  git -C "$JETWAY_DIR" checkout --quiet --detach "$wanted"
  reload_workers=1
fi
# make decides what is missing (Debian's pypy3, the .venv from the pinned
# requirements) and does nothing when nothing is.
make -C "$JETWAY_DIR" --no-print-directory setup
# JETWAY_USER cannot write __pycache__ in a root-owned tree: compile once here.
"$JETWAY_DIR/.venv/bin/python" -m compileall -q "$JETWAY_DIR/api" "$JETWAY_DIR/handlers" "$JETWAY_DIR/cache"
# `make setup` also installs redis-server, for `make run`'s private Redis;
# this instance uses REDIS_URL, so Debian's Redis service does not run here.
if systemctl is-enabled --quiet redis-server 2>/dev/null; then
  systemctl disable --now --quiet redis-server
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
# (`make run` or the admin CLI by hand). 1048576 is the benchmark's value and
# the kernel's per-process maximum (fs.nr_open). supervisord, a systemd
# service, ignores this file: its limit is LimitNOFILE in its drop-in.
*     soft  nofile  1048576
*     hard  nofile  1048576
root  soft  nofile  1048576
root  hard  nofile  1048576
EOF

# --- 4. settings, supervisor ------------------------------------------------
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
if put_file 0644 "$ETC/supervisor/conf.d/jetway.conf" <"$JETWAY_DIR/deploy/supervisor/jetway.conf"; then
  update_program=1
fi

systemctl is-enabled --quiet supervisor || systemctl enable --quiet supervisor
if [ "$restart_supervisor" = 1 ]; then
  # supervisord reads its environment only when it starts. Stopping drains.
  systemctl restart supervisor
elif [ "$update_program" = 1 ]; then
  supervisorctl update # restarts jetway only if its program section changed
elif [ "$reload_workers" = 1 ]; then
  supervisorctl signal HUP jetway # new workers on the new code, no failed request
fi
systemctl is-active --quiet supervisor || systemctl start supervisor

# --- 5. serving? -------------------------------------------------------------
for _ in $(seq 90); do
  if curl -fsS -o /dev/null "http://127.0.0.1:${JETWAY_PORT}/healthz"; then
    echo "jetway: serving on port ${JETWAY_PORT}"
    exit 0
  fi
  sleep 2
done
echo "jetway: not answering on port ${JETWAY_PORT} after 3 minutes; see ${JETWAY_LOG_DIR}/jetway.log" >&2
exit 1
