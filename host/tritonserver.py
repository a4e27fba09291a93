"""`tritonserver`: modelhost started the way Triton's own binary starts, for scripts written for it.

`modelhost serve` takes every `tritonserver` flag (host.cli_triton), but three of its defaults are
friendlier than Triton's: a model that fails to load leaves the others serving and the server
ready, and the server calls itself "modelhost". A deployment script, a health check or a QA suite
written against Triton expects Triton's defaults, so this command serves with them:

- `--exit-on-error=true`: a model that fails to load at start stops the server (exit status 1);
- `--strict-readiness=true`: ready only while every model asked for is READY;
- `--id=triton`: the name in the server metadata.

Flags given on the command line still win (the last occurrence of a flag counts), so
`tritonserver --exit-on-error=false ...` behaves as in Triton.
"""

from __future__ import annotations

import sys
from typing import Sequence

from host.cli import main as modelhost_main

TRITON_DEFAULTS = ("--exit-on-error=true", "--strict-readiness=true", "--id=triton")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("--version", "-h", "--help"):
        return modelhost_main(args if args[0] == "--version" else ["serve", *args])
    return modelhost_main(["serve", *TRITON_DEFAULTS, *args])


if __name__ == "__main__":
    raise SystemExit(main())
