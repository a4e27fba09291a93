"""`python -m host.healthcheck`: exit 0 when the local server is ready (the image's HEALTHCHECK).

Asks Triton's readiness endpoint, GET /v2/health/ready, on 127.0.0.1 and the HTTP port of the
server's settings (MODELHOST_HTTP_PORT, else 8000). No curl in a slim image: Python is there.
"""

from __future__ import annotations

import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("MODELHOST_HTTP_PORT", "8000")
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=float(os.environ.get("MODELHOST_HEALTHCHECK_TIMEOUT", "3"))) as r:
            return 0 if r.status == 200 else 1
    except OSError as exc:
        print(f"not ready: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
