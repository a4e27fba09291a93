"""`python -m host.healthcheck`: exit 0 when the local server is ready (the image's HEALTHCHECK).

Asks Triton's readiness endpoint, GET /v2/health/ready, on the HTTP address and port of the
server's own settings: the same MODELHOST_* variables and config file (MODELHOST_CONFIG_FILE)
that `modelhost serve` reads in the container. No curl in a slim image: Python is there.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def ready_url() -> str:
    from host import cli

    args = cli.parse_serve_args(cli.build_parser(), [], os.environ)
    address = args.http_address
    if address in ("0.0.0.0", "", "::", "[::]"):  # listening everywhere: ask over loopback
        address = "127.0.0.1"
    elif ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"http://{address}:{args.http_port}/v2/health/ready"


def main() -> int:
    url = ready_url()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=float(os.environ.get("MODELHOST_HEALTHCHECK_TIMEOUT", "3"))) as r:
            return 0 if r.status == 200 else 1
    except OSError as exc:
        print(f"not ready: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
