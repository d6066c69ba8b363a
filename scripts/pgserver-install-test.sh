#!/usr/bin/env bash
# pgserver-install-test.sh: run scripts/pgserver.sh's install path for real, as on a
# fresh machine, without touching this one: in a private mount namespace, / is
# overlaid with a tmpfs, and in a chroot of that overlay Debian's postgresql
# packages are purged and apt's package lists deleted; then `pgserver.sh start`
# must install postgresql (apt-get install fails without lists, so it runs
# apt-get update and installs again), create its user, initdb and start a server
# that answers a query, and `pgserver.sh stop` must stop it. Everything the run
# changes lives in the tmpfs and goes with the namespace.
#
# Needs root, unshare(1), overlayfs and network access to the Debian mirror.
# Usage: scripts/pgserver-install-test.sh    (prints the log lines; exit 0 = pass)
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "pgserver-install-test.sh: needs root" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
base=$(mktemp -d "${TMPDIR:-/tmp}/pgserver-install-test.XXXXXX")
trap 'rm -rf "$base"' EXIT
cp "$here/pgserver.sh" "$base/pgserver.sh"
export base
unshare -m --propagation private bash -euo pipefail -c '
mkdir -p "$base/t"
mount -t tmpfs tmpfs "$base/t"
mkdir -p "$base/t/upper" "$base/t/work" "$base/t/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$base/t/upper,workdir=$base/t/work" "$base/t/root"
R=$base/t/root
mount --bind /proc "$R/proc"; mount --bind /dev "$R/dev"; mount --bind /sys "$R/sys"
mount -t tmpfs tmpfs "$R/tmp"
cp "$base/pgserver.sh" "$R/tmp/pgserver.sh"
chroot "$R" /bin/bash -euo pipefail -c "
export DEBIAN_FRONTEND=noninteractive
pkgs=\$(dpkg-query -W -f=\"\\\${db:Status-Abbrev} \\\${Package}\\n\" \"postgresql*\" 2>/dev/null | awk \"/^ii/ {print \\\$2}\")
[ -z \"\$pkgs\" ] || dpkg --purge --force-depends \$pkgs >/tmp/purge.log 2>&1
rm -f /usr/local/bin/initdb /usr/local/bin/pg_ctl /usr/local/bin/postgres
rm -rf /var/lib/apt/lists/*
if dpkg -s postgresql >/dev/null 2>&1 || ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
	echo \"FAIL: postgresql still present after the purge\"; exit 1
fi
userdel mtxdbpg >/dev/null 2>&1 || true
echo \"postgresql absent, apt lists removed\"
url=\$(bash /tmp/pgserver.sh start /tmp/pg)
grep \"^==\" /tmp/pg/pgserver.log
psql \"\$url\" -Atc \"SELECT version()\"
bash /tmp/pgserver.sh stop /tmp/pg
bash /tmp/pgserver.sh url /tmp/pg >/dev/null 2>&1 && { echo \"FAIL: url after stop\"; exit 1; }
echo \"PASS: installed, started, answered, stopped\"
"
'
