#!/usr/bin/env bash
# The Debian bookworm root that tests/deploy/test_deploy_boot.py boots: minbase, as an
# EC2 Debian image is before its user data runs, with systemd (to boot it with
# systemd-nspawn -b), dbus and cloud-init (which runs the user data). Built
# once into DIR and kept: later runs copy it.
#
#   tests/deploy/base_root.sh DIR
set -euo pipefail
DIR=${1:?the directory to build the root in}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ -f "$DIR/.jetway-base-complete" ]; then
  exit 0
fi
rm -rf "$DIR.partial"
mkdir -p "$(dirname "$DIR")"
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,ca-certificates bookworm "$DIR.partial" "$MIRROR"
# cloud-init afterwards: debootstrap's own ordering fails to configure its Python dependencies.
chroot "$DIR.partial" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
  bash -c 'apt-get install -y -qq --no-install-recommends cloud-init && apt-get clean'
# No console getty in a container: it would wait on a terminal nobody has.
ln -sf /dev/null "$DIR.partial/etc/systemd/system/console-getty.service"
echo jetway-boot > "$DIR.partial/etc/hostname"
rm -rf "$DIR"
mv "$DIR.partial" "$DIR"
touch "$DIR/.jetway-base-complete"
