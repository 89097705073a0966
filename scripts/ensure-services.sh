#!/usr/bin/env bash
# Make sure what the tests need is there: PostgreSQL and Redis answering on 127.0.0.1,
# Debian's Chromium for the browser tests, Debian's fitsverify (HEASARC's FITS validator)
# for the product files' tests and Debian's faketime for the worker clock test. Starts or installs what is missing (as the
# machine allows) and fails loudly if it cannot.
set -uo pipefail

fail() { echo "ensure-services: $*" >&2; exit 1; }

pg_ok() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null || python3 - <<'PY' 2>/dev/null
import socket,sys
s=socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1",5432))==0 else 1)
PY
}
redis_ok() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }

if ! pg_ok; then
  echo "ensure-services: PostgreSQL is not answering; starting it"
  if command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
  for _ in $(seq 1 30); do pg_ok && break; sleep 1; done
  pg_ok || fail "PostgreSQL does not answer on 127.0.0.1:5432 and could not be started"
fi

if ! redis_ok; then
  echo "ensure-services: Redis is not answering; starting it"
  if command -v redis-server >/dev/null; then
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  fi
  for _ in $(seq 1 20); do redis_ok && break; sleep 0.5; done
  redis_ok || fail "Redis does not answer on 127.0.0.1:6379 and could not be started"
fi

# apt_need COMMAND PACKAGE PURPOSE: install Debian's PACKAGE when COMMAND is missing (as root), else fail
apt_need() {
  command -v "$1" >/dev/null && return 0
  echo "ensure-services: installing Debian's $2 for $3"
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null) \
      || fail "apt-get install $2 failed"
  else
    fail "$1 is missing; install Debian's $2 package (as root: apt-get install $2)"
  fi
  command -v "$1" >/dev/null || fail "$1 is still missing after installing $2"
}

apt_need /usr/bin/chromium chromium "the browser tests"
apt_need fitsverify fitsverify "the FITS validity tests"
apt_need faketime faketime "the worker clock test (tests/test_workers.py)"
apt_need nft nftables "the network-namespace rig's faults (tests/cluster)"
echo "ensure-services: PostgreSQL, Redis, Chromium, fitsverify and faketime are ready"
