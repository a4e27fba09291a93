"""A WSGI entry point for any WSGI server: `create()` builds a Host and returns its HTTP app.

    gunicorn -w 1 -k gthread --threads 16 -b 0.0.0.0:8000 'host.wsgi:create()'
    MODELHOST_MODEL_REPOSITORY=/models gunicorn 'host.wsgi:create()'
    uwsgi --http :8000 --lazy-apps --threads 16 --module 'host.wsgi:create()'   # any server

Call it in the worker process, after the fork (gunicorn does, unless `--preload`): models and
CUDA contexts must not be created in a master process that forks. Only the HTTP front end is
served this way; `modelhost serve` adds gRPC and metrics. Each worker process loads its own
copy of every model, so several workers are several replicas.

Options come from the arguments, else the environment: MODELHOST_MODEL_REPOSITORY (colon-separated
roots, default ./model_repository), MODELHOST_MODEL_CONTROL_MODE (none), MODELHOST_BLOCK_PLUGINS.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

from host.options import ServerOptions


def create(model_repository: str | None = None, model_control_mode: str | None = None) -> Any:
    """The falcon WSGI app serving a freshly started Host; the Host stops at interpreter exit."""
    from host.core import Host
    from host.http.app import create_app

    roots = model_repository or os.environ.get("MODELHOST_MODEL_REPOSITORY", "model_repository")
    options = ServerOptions(
        model_repositories=[Path(r) for r in roots.split(os.pathsep) if r],
        model_control_mode=model_control_mode
        or os.environ.get("MODELHOST_MODEL_CONTROL_MODE", "none"))
    host = Host(options)
    host.start()
    atexit.register(host.stop)
    return create_app(host, max_input_size=options.http_max_input_size)
