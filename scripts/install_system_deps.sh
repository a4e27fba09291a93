#!/usr/bin/env bash
# Debian packages the test suite uses, installed when missing (tox runs this before the tests, so
# the README's one test command is enough on a fresh machine):
#   redis-server  the redis cache plugin's tests start their own on a free loopback port
#   haproxy       the load balancer in front of the replicas of the scale-out test
#   iproute2      `ip netns`, `ip link`: the scale-out test's network namespaces
#   util-linux    `unshare`: a replica's private /dev/shm in the scale-out test
#   npm           to install Azurite (Microsoft's Azure Storage emulator) for the as:// repository
#                 tests, into the user's cache (tests/storage_models.py finds it there), not system-wide
set -uo pipefail
AZURITE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/modelhost/azurite"
have_azurite() { command -v azurite-blob >/dev/null 2>&1 || [ -x "$AZURITE_DIR/node_modules/.bin/azurite-blob" ]; }
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
have_azurite || command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else SUDO="none"; fi
    fi
    if [ "$SUDO" = none ]; then
        echo "warning: not root and no sudo: cannot install ${missing[*]}; tests that need them are skipped" >&2
    else
        echo "installing ${missing[*]} (apt-get)" >&2
        $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
            || echo "warning: could not install ${missing[*]}; tests that need them are skipped" >&2
    fi
fi
if ! have_azurite && command -v npm >/dev/null 2>&1; then
    echo "installing azurite (npm) into $AZURITE_DIR" >&2
    # Node trusts only its own CA list: behind a TLS-intercepting proxy (whose CA the system
    # bundle holds, as on this project's machines) npm fails with SELF_SIGNED_CERT_IN_CHAIN.
    # The system bundle is added to Node's list, not put in its place.
    bundle="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
    if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -f "$bundle" ]; then export NODE_EXTRA_CA_CERTS="$bundle"; fi
    npm install --prefix "$AZURITE_DIR" --no-audit --no-fund --loglevel=error azurite@3 >&2 \
        || echo "warning: could not install azurite; the as:// repository tests are skipped" >&2
fi
exit 0
