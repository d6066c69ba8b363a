#!/usr/bin/env bash
# pgserver.sh: a throwaway PostgreSQL server for tests and benchmarks.
#
#   scripts/pgserver.sh start DIR   start (first time: install, initdb) a server whose
#                                   cluster lives in DIR; print its URL on stdout
#   scripts/pgserver.sh stop DIR    stop it (fast shutdown); no-op if not running
#   scripts/pgserver.sh url DIR     print the URL of the server running in DIR;
#                                   exit 1 if none is running
#
# The URL has the form
#   postgres://mtxdb:PASSWORD@127.0.0.1:PORT/mtxdb?sslmode=disable
# The user is a superuser of that cluster (it may CREATE DATABASE), PASSWORD is random
# (scram-sha-256), PORT is a free loopback port chosen at the first start and kept
# while it stays free. The server listens on 127.0.0.1 only and has no Unix socket.
#
# Files in DIR: url (the URL), env (PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE lines a
# shell can source), data/ (the cluster), server.log (the server's log), pgserver.log
# (this script's log: apt-get, initdb). Nothing else is written outside DIR except by
# the install step.
#
# Behaviour:
# - Installs Debian's `postgresql` package with apt-get when no server binaries are
#   found (runs `apt-get update` only if the install fails without it). Needs root or
#   passwordless sudo for that step only.
# - PostgreSQL refuses to run as root: run as root, the script runs the server as the
#   system user PGSERVER_USER (default mtxdbpg), created if missing; DIR is made
#   searchable (o+x) for it, and DIR's parents must be searchable already.
# - Idempotent: start on a running server prints its URL; start after stop (or after a
#   reboot, or a killed server) restarts the same cluster; stop on a stopped or missing
#   DIR succeeds. Concurrent calls on one DIR are serialised (flock on DIR/.lock).
# - Quiet: stdout carries only the URL; on failure a message and the log's last lines
#   go to stderr and the exit status is non-zero.
#
# Environment: PG_BINDIR (server binaries; default: the newest
# /usr/lib/postgresql/*/bin, else initdb on PATH), PGSERVER_USER (see above),
# PGSERVER_PORT (listen on this port instead of a free one picked at random; start
# fails when another process holds it or the server in DIR runs on another port),
# PGSERVER_FAST=1 (fsync, synchronous_commit and full_page_writes off: for tests only,
# never for benchmarks; applies at every start).
set -euo pipefail

die() {
	echo "pgserver.sh: $*" >&2
	exit 1
}

usage() {
	die "usage: pgserver.sh start|stop|url DIR"
}

[ $# -eq 2 ] || usage
cmd=$1
[ -n "$2" ] || usage
case $cmd in start | stop | url) ;; *) usage ;; esac

if [ "$cmd" != start ] && [ ! -d "$2" ]; then
	[ "$cmd" = stop ] && exit 0
	die "no server in $2 (no such directory)"
fi
mkdir -p "$2"
DIR=$(cd "$2" && pwd -P)
DATA=$DIR/data
LOG=$DIR/pgserver.log
SLOG=$DIR/server.log

# tail_log FILE: the last lines of FILE on stderr.
tail_log() {
	if [ -s "$1" ]; then
		echo "--- last lines of $1:" >&2
		tail -n 20 "$1" >&2
	fi
}

fail() {
	echo "pgserver.sh: $1" >&2
	shift
	for f in "$@"; do tail_log "$f"; done
	exit 1
}

# Serialise calls on the same DIR.
exec 9>>"$DIR/.lock"
flock 9

# find_bindir: the directory holding initdb, pg_ctl and postgres, or nothing.
find_bindir() {
	local d
	if [ -n "${PG_BINDIR:-}" ]; then
		[ -x "$PG_BINDIR/pg_ctl" ] && echo "$PG_BINDIR"
		return 0
	fi
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
			echo "$d"
			return 0
		fi
	done
	if d=$(command -v initdb 2>/dev/null); then
		d=$(dirname "$(readlink -f "$d")")
		[ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ] && echo "$d"
	fi
	return 0
}

# install_postgresql: apt-get install postgresql, with apt-get update only if needed.
install_postgresql() {
	local sudo=
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null && sudo -n true 2>/dev/null ||
			die "PostgreSQL is not installed and installing it needs root (apt-get install postgresql)"
		sudo="sudo -n"
	fi
	command -v apt-get >/dev/null || die "PostgreSQL is not installed and there is no apt-get: install it, or set PG_BINDIR"
	local apt="$sudo env DEBIAN_FRONTEND=noninteractive apt-get -q -y"
	echo "== apt-get install postgresql ($(date -u +%FT%TZ))" >>"$LOG"
	if ! $apt install --no-install-recommends postgresql >>"$LOG" 2>&1; then
		echo "== apt-get update, then install again" >>"$LOG"
		$apt update >>"$LOG" 2>&1 || fail "apt-get update failed" "$LOG"
		$apt install --no-install-recommends postgresql >>"$LOG" 2>&1 ||
			fail "apt-get install postgresql failed" "$LOG"
	fi
}

BINDIR=$(find_bindir)
if [ -z "$BINDIR" ]; then
	[ "$cmd" = start ] || die "no PostgreSQL server binaries found (set PG_BINDIR)"
	install_postgresql
	BINDIR=$(find_bindir)
	[ -n "$BINDIR" ] || fail "postgresql installed but no initdb/pg_ctl/postgres found under /usr/lib/postgresql/*/bin" "$LOG"
fi

# as_server CMD...: run CMD as the server's user (the caller unless root).
SUSER=
if [ "$(id -u)" -eq 0 ]; then
	SUSER=${PGSERVER_USER:-mtxdbpg}
fi
as_server() {
	if [ -z "$SUSER" ]; then
		"$@"
	elif command -v runuser >/dev/null; then
		runuser -u "$SUSER" -- "$@"
	else
		su -s /bin/sh -c '"$0" "$@"' "$SUSER" "$@"
	fi
}

# detached CMD...: as_server CMD with every descriptor above 2 closed, so the server
# holds neither the lock nor a caller's pipe (url=$(pgserver.sh start DIR) returns).
detached() (
	for fd in $(ls /proc/$BASHPID/fd); do
		[ "$fd" -gt 2 ] && eval "exec $fd>&-"
	done 2>/dev/null
	as_server "$@"
)

# postmaster_alive: the PID in DATA/postmaster.pid is a live process. A zombie counts as
# dead: in containers whose PID 1 does not reap, a killed postmaster stays one, and
# pg_ctl (kill(pid, 0)) would take it for a running server.
postmaster_alive() {
	local pid state
	[ -f "$DATA/postmaster.pid" ] || return 1
	pid=$(head -n 1 "$DATA/postmaster.pid" 2>/dev/null) || return 1
	case $pid in '' | *[!0-9]*) return 1 ;; esac
	state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) || return 1
	[ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

running() {
	[ -f "$DATA/PG_VERSION" ] && postmaster_alive &&
		as_server "$BINDIR/pg_ctl" status -D "$DATA" >/dev/null 2>&1
}

case $cmd in
stop)
	if running; then
		as_server "$BINDIR/pg_ctl" stop -D "$DATA" -m fast -w -t 60 >>"$LOG" 2>&1 ||
			fail "pg_ctl stop failed" "$LOG" "$SLOG"
	fi
	exit 0
	;;
url)
	running || die "no server running in $DIR"
	[ -s "$DIR/url" ] || die "server running in $DIR but $DIR/url is missing"
	cat "$DIR/url"
	exit 0
	;;
esac

# --- start ---

if running && [ -s "$DIR/url" ] && [ "${PGSERVER_PORT:-$(cat "$DIR/port" 2>/dev/null)}" = "$(cat "$DIR/port" 2>/dev/null)" ]; then
	cat "$DIR/url"
	exit 0
fi
already=
running && already=1
# A killed server's lock file names a dead (or zombie) process: remove it, or the new
# postmaster refuses to start.
if [ -z "$already" ] && [ -f "$DATA/postmaster.pid" ] && ! postmaster_alive; then
	rm -f "$DATA/postmaster.pid"
fi

if [ -n "$SUSER" ]; then
	if ! id -u "$SUSER" >/dev/null 2>&1; then
		useradd --system --user-group --no-create-home --home-dir /nonexistent \
			--shell /usr/sbin/nologin "$SUSER" >>"$LOG" 2>&1 ||
			fail "could not create user $SUSER" "$LOG"
	fi
	chmod o+x "$DIR"
	as_server test -x "$DIR" ||
		die "user $SUSER cannot reach $DIR: a parent directory is not searchable (chmod o+x it, or use a DIR under /tmp)"
fi

# First start: initdb with a random password.
if [ ! -f "$DATA/PG_VERSION" ]; then
	rm -rf "$DATA" "$DIR/url" "$DIR/env" "$DIR/port"
	password=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	pwfile=$DIR/.pwfile
	(umask 077 && printf '%s\n' "$password" >"$pwfile")
	mkdir -m 700 "$DATA"
	if [ -n "$SUSER" ]; then
		chown "$SUSER" "$pwfile" "$DATA"
	fi
	echo "== initdb ($(date -u +%FT%TZ))" >>"$LOG"
	if ! as_server "$BINDIR/initdb" -D "$DATA" -U mtxdb --pwfile="$pwfile" \
		--auth-host=scram-sha-256 --auth-local=scram-sha-256 \
		--no-locale --encoding=UTF8 --no-sync >>"$LOG" 2>&1; then
		rm -f "$pwfile"
		rm -rf "$DATA"
		fail "initdb failed" "$LOG"
	fi
	rm -f "$pwfile"
	cat >>"$DATA/postgresql.conf" <<-'EOF'

		# pgserver.sh: loopback only, no Unix socket, room for parallel test packages.
		listen_addresses = '127.0.0.1'
		unix_socket_directories = ''
		max_connections = 200
		logging_collector = off
	EOF
	(umask 077 && printf '%s\n' "$password" >"$DIR/.password")
fi
[ -s "$DIR/.password" ] || fail "cluster in $DATA has no recorded password ($DIR/.password): remove $DIR and start again"
password=$(cat "$DIR/.password")

# port_free PORT: no socket listens on PORT (IPv4 or IPv6), from /proc/net.
port_free() {
	local hex
	hex=$(printf ':%04X' "$1")
	! cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p="$hex" '
		NR > 0 && $4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
		END { exit !found }'
}

pick_port() {
	local p i
	for i in $(seq 1 200); do
		# Below Linux's ephemeral range (32768-60999), above common services.
		p=$((15000 + RANDOM % 17000))
		if port_free "$p"; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

fastopts=
if [ "${PGSERVER_FAST:-}" = 1 ]; then
	fastopts="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
fi

if [ -n "$SUSER" ]; then
	touch "$SLOG"
	chown "$SUSER" "$SLOG"
fi
port=
[ -s "$DIR/port" ] && port=$(cat "$DIR/port")
started=
[ -n "$already" ] && [ -n "$port" ] && started=1
if [ -n "${PGSERVER_PORT:-}" ]; then
	[ -z "$started" ] || [ "$port" = "$PGSERVER_PORT" ] ||
		die "the server in $DIR runs on port $port, not PGSERVER_PORT=$PGSERVER_PORT: stop it first"
	port=$PGSERVER_PORT
	[ -n "$started" ] || port_free "$port" || die "port $port (PGSERVER_PORT) is in use"
fi
for attempt in $(seq 1 10); do
	[ -z "$started" ] || break
	if [ -n "${PGSERVER_PORT:-}" ] && [ "$attempt" -gt 1 ]; then
		fail "the server did not start on port $PGSERVER_PORT (PGSERVER_PORT): it is in use" "$SLOG"
	elif [ -z "$port" ] || ! port_free "$port"; then
		port=$(pick_port) || fail "no free loopback port found"
	fi
	: >"$SLOG"
	echo "== pg_ctl start on port $port ($(date -u +%FT%TZ))" >>"$LOG"
	if detached "$BINDIR/pg_ctl" start -D "$DATA" -l "$SLOG" -w -t 120 \
		-o "-p $port $fastopts" >>"$LOG" 2>&1; then
		started=1
		break
	fi
	# Lost a race for the port: try another; anything else is fatal.
	if grep -q -E 'could not (bind|create listen socket)|Address already in use' "$SLOG"; then
		port=
		continue
	fi
	fail "the server did not start" "$LOG" "$SLOG"
done
[ -n "$started" ] || fail "the server did not start: no free port after 10 attempts" "$LOG" "$SLOG"
echo "$port" >"$DIR/port"

export PGPASSWORD=$password
psql=$BINDIR/psql
[ -x "$psql" ] || psql=psql
if ! "$psql" -X -q -h 127.0.0.1 -p "$port" -U mtxdb -d postgres -tAc \
	"SELECT 1 FROM pg_database WHERE datname = 'mtxdb'" 2>>"$LOG" | grep -q 1; then
	"$psql" -X -q -h 127.0.0.1 -p "$port" -U mtxdb -d postgres -c 'CREATE DATABASE mtxdb' >>"$LOG" 2>&1 ||
		fail "CREATE DATABASE mtxdb failed" "$LOG" "$SLOG"
fi

url="postgres://mtxdb:$password@127.0.0.1:$port/mtxdb?sslmode=disable"
(
	umask 077
	printf '%s\n' "$url" >"$DIR/url"
	printf 'PGHOST=127.0.0.1\nPGPORT=%s\nPGUSER=mtxdb\nPGPASSWORD=%s\nPGDATABASE=mtxdb\nPGSSLMODE=disable\n' \
		"$port" "$password" >"$DIR/env"
)
echo "$url"
