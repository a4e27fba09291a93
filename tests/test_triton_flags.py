"""Triton's command-line flags that scripts pass as a matter of course: every `tritonserver` flag
is taken, with Triton's meaning where it has one here (docs/triton_compat.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from host.testing import serve

MODELS = Path(__file__).resolve().parent.parent / "model_repository"


def test_grpc_keepalive_flags_reach_the_server(tmp_path):
    flags = ["--grpc-keepalive-time=10000", "--grpc-keepalive-timeout=5000",
             "--grpc-keepalive-permit-without-calls=true",
             "--grpc-http2-max-pings-without-data=0",
             "--grpc-http2-min-recv-ping-interval-without-data=5000",
             "--grpc-http2-max-ping-strikes=0", "--grpc-max-connection-age=60000",
             "--allow-gpu-metrics=false", "--enable-peer-access=false",
             "--host-policy=gpu_0,numa-node=0", "--repoagent-directory=/nowhere",
             "--log-verbose=true", "--model-control-mode=explicit", "--load-model=simple"]
    with serve(MODELS, *flags) as server:
        # Triton's simple_grpc_keepalive_client: a client that pings often, allowed by the flags
        client = grpcclient.InferenceServerClient(server.grpc_url, keepalive_options=grpcclient.KeepAliveOptions(
            keepalive_time_ms=2**31 - 1, keepalive_timeout_ms=20000,
            keepalive_permit_without_calls=False, http2_max_pings_without_data=2))
        a = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        b = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
        data = np.arange(16, dtype=np.int32).reshape(1, 16)
        a.set_data_from_numpy(data)
        b.set_data_from_numpy(data)
        result = client.infer("simple", [a, b])
        assert (result.as_numpy("OUTPUT0") == data * 2).all()
        text = server.log_text()
    table = text[text.index("GRPC KeepAlive Option"):]
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in table.splitlines()[2:10] if line.startswith("| ")}
    assert rows == {"keepalive_time_ms": "10000", "keepalive_timeout_ms": "5000",
                    "keepalive_permit_without_calls": "1", "http2_max_pings_without_data": "0",
                    "http2_min_recv_ping_interval_without_data_ms": "5000",
                    "http2_max_ping_strikes": "0", "max_connection_age_ms": "60000"}


def test_bad_host_policy_is_refused_with_tritons_text():
    done = subprocess.run([sys.executable, "-m", "host", "serve", "--host-policy=gpu_0",
                           "--model-repository", str(MODELS)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert "--host-policy option format is '<policy name>,<setting>=<value>'. Got gpu_0" in done.stderr
