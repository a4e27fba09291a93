#!/usr/bin/env bash
# Debian packages the test suite uses, installed when missing (tox runs this before the tests, so
# the README's one test command is enough on a fresh machine):
#   redis-server  the redis cache plugin's tests start their own on a free loopback port
#   haproxy       the load balancer in front of the replicas of the scale-out test
#   iproute2      `ip netns`, `ip link`: the scale-out test's network namespaces
#   util-linux    `unshare`: a replica's private /dev/shm in the scale-out test
set -uo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "warning: not root and no sudo: cannot install ${missing[*]}; tests that need them are skipped" >&2
        exit 0
    fi
fi
echo "installing ${missing[*]} (apt-get)" >&2
$SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
    || echo "warning: could not install ${missing[*]}; tests that need them are skipped" >&2
exit 0
