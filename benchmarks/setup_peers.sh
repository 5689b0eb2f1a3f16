#!/usr/bin/env bash
# Install the peer servers and client libraries the benchmark compares qclient with.
#   bash benchmarks/setup_peers.sh            # no-op when everything is there already
#   bash benchmarks/setup_peers.sh --force    # apt-get / pip again
#   PYTHON=.venv/bin/python bash benchmarks/setup_peers.sh
# Needs root or sudo for apt-get (Debian/Ubuntu). The bench starts each server itself
# (loopback, free port, temp data dir) and stops it afterwards, so the packaged services
# are not started here (policy-rc.d).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3

have_all() {
    command -v redis-server >/dev/null && command -v beanstalkd >/dev/null \
        && [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] \
        && "$PYTHON" -c "import redis, pika, greenstalk, celery" 2>/dev/null
}
if [ "${1:-}" != "--force" ] && have_all; then
    echo "setup_peers: already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "setup_peers: need root (or sudo) for apt-get" >&2; exit 1
    fi
fi

if command -v apt-get >/dev/null 2>&1; then
    # policy-rc.d 101: do not start the packaged services during install (no systemd here,
    # and the bench runs its own instances on free ports).
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
        $SUDO chmod +x "$policy"
        created_policy=1
    fi
    trap 'if [ "$created_policy" = 1 ]; then $SUDO rm -f "$policy"; fi' EXIT
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
        redis-server beanstalkd rabbitmq-server
else
    echo "setup_peers: no apt-get; install redis-server, beanstalkd and rabbitmq-server" \
         "with your package manager" >&2
fi

"$PYTHON" -m pip install -q "redis>=5" "pika>=1.3" "greenstalk>=2.0" "celery[redis]>=5.3"
echo "setup_peers: done"
