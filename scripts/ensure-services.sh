#!/usr/bin/env bash
# Checks that the machine's PostgreSQL (127.0.0.1:5432), MariaDB
# (127.0.0.1:3306, root without a password) and Redis (127.0.0.1:6379)
# answer, and starts them if they do not. Tests that kill a server start
# their own private instances instead of touching these.
set -euo pipefail

pg_ok() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
redis_ok() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
# `service mariadb status` misreports a server started at boot: ask it.
mariadb_ok() { mariadb -h 127.0.0.1 -P 3306 -u root -e 'select 1' >/dev/null 2>&1; }
# The Postgres store tests create a schema each in the database `test`.
test_db() {
  psql -h 127.0.0.1 -U postgres -d postgres -Atc \
    "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
    || createdb -h 127.0.0.1 -U postgres test
}

if ! pg_ok; then
  echo "postgres: not answering, starting it"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
if ! mariadb_ok; then
  echo "mariadb: not answering, starting it"
  service mariadb start >/dev/null 2>&1 || true
fi
if ! redis_ok; then
  echo "redis: not answering, starting it"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
fi

for _ in $(seq 1 50); do
  if pg_ok && redis_ok && mariadb_ok; then
    test_db
    # The MySQL store tests create a database each next to `test`.
    mariadb -h 127.0.0.1 -P 3306 -u root -e 'CREATE DATABASE IF NOT EXISTS test'
    echo "postgres, mariadb and redis answer"
    exit 0
  fi
  sleep 0.2
done
pg_ok || echo "postgres: still not answering on 127.0.0.1:5432" >&2
redis_ok || echo "redis: still not answering on 127.0.0.1:6379" >&2
mariadb_ok || echo "mariadb: still not answering on 127.0.0.1:3306" >&2
exit 1
