"""A WSGI entry point for any WSGI server: `create()` builds a Host and returns its HTTP app.

    gunicorn -w 1 -k gthread --threads 16 -b 0.0.0.0:8000 'host.wsgi:create()'
    MODELHOST_MODEL_REPOSITORY=/models gunicorn 'host.wsgi:create()'
    uwsgi --http :8000 --lazy-apps --threads 16 --module 'host.wsgi:create()'   # any server

Call it in the worker process, after the fork (gunicorn does, unless `--preload`): models and
CUDA contexts must not be created in a master process that forks. Only the HTTP front end is
served this way; `modelhost serve` adds gRPC and metrics. Each worker process loads its own
copy of every model, so several workers are several replicas.

Options come from the arguments, else from the same MODELHOST_* variables and config file
(MODELHOST_CONFIG_FILE) as `modelhost serve` (host.settings): MODELHOST_MODEL_REPOSITORY (roots
separated by ';', default ./model_repository), MODELHOST_MODEL_CONTROL_MODE, MODELHOST_CACHE_CONFIG,
MODELHOST_BLOCK_PLUGINS, ...
"""

from __future__ import annotations

import atexit
import os
from typing import Any


def create(model_repository: str | None = None, model_control_mode: str | None = None) -> Any:
    """The falcon WSGI app serving a freshly started Host; the Host stops at interpreter exit."""
    from host import cli, storage
    from host.core import Host
    from host.http.app import create_app

    options = cli.options_from_args(cli.parse_serve_args(cli.build_parser(), [], os.environ))
    if model_repository:
        options.model_repositories = [storage.parse_root(r) for r in model_repository.split(os.pathsep) if r]
    if model_control_mode:
        options.model_control_mode = model_control_mode
    host = Host(options)
    host.start()
    atexit.register(host.stop)
    return create_app(host, max_input_size=options.http_max_input_size)
