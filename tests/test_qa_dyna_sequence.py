"""Sequence batching of variable-shape inputs for a native backend, as Triton's
L0_dyna_sequence_batcher checks it (test_multi_sequence_different_shape and its
allow_ragged_batch twin): requests whose inputs differ in shape never share an execute, unless
the input allows ragged batches.

- oldest strategy: a request of another shape than the oldest one ends the batch;
- direct strategy: the lowest busy slot sets the shapes; a slot whose request has other shapes
  gets a padding row this time (READY false) and keeps its request for the next batch.

The batches are read back from the statistics and from the `batch_requests` parameter that the
identity test backend (tests/native/identity.c) sets on each response. TRITONSERVER_DELAY_SCHEDULER
holds each model's first batch until both requests are queued, so the batches do not depend on
timing. Real Triton 2.51 gives the same results on these models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from host.native.testing import build_library, compiler
from host.testing import serve

pytestmark = [
    pytest.mark.modelhost_only,
    pytest.mark.skipif(compiler() is None, reason="no C compiler to build the identity backend"),
]

SOURCES = Path(__file__).resolve().parent / "native"

CONFIG = """
name: "{name}"
backend: "identity"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] {ragged} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
}}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

OLDEST = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] }"
DIRECT = "direct { }"
RAGGED = "allow_ragged_batch: true"

MODELS = {
    "oldest_fixed": (OLDEST, ""),
    "oldest_ragged": (OLDEST, RAGGED),
    "direct_fixed": (DIRECT, ""),
    "direct_ragged": (DIRECT, RAGGED),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa-dyna")
    repo = root / "models"
    lib = build_library(SOURCES / "identity.c", root / "backends" / "identity" / "libtriton_identity.so")
    for name, (strategy, ragged) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            CONFIG.format(name=name, strategy=strategy, ragged=ragged))
    with serve(repo, "--backend-directory", str(lib.parent.parent),
               env={"TRITONSERVER_DELAY_SCHEDULER": "2"}) as process:
        yield process


def _two_sequences(server, model: str) -> list[tuple[list[list[int]], int]]:
    """The first requests of two sequences, of different shapes, sent together: (output,
    batch_requests). The sequences stay open: each keeps its own slot (Triton's oldest strategy
    frees a slot as soon as its END request is issued, so one-request sequences would share one
    slot there and never batch)."""
    client = httpclient.InferenceServerClient(server.url, concurrency=2, network_timeout=60)
    try:
        pending = []
        for sequence_id, width in ((11, 3), (12, 1)):
            x = httpclient.InferInput("INPUT0", [1, width], "INT32")
            x.set_data_from_numpy(np.full((1, width), sequence_id, dtype=np.int32))
            pending.append(client.async_infer(model, [x], sequence_id=sequence_id,
                                              sequence_start=True))
        results = [p.get_result() for p in pending]
        return [(r.as_numpy("OUTPUT0").tolist(), r.get_response()["parameters"]["batch_requests"])
                for r in results]
    finally:
        client.close()


def _batches(server, model: str) -> tuple[int, dict[int, int]]:
    client = httpclient.InferenceServerClient(server.url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    assert stats["inference_count"] == 2
    return stats["execution_count"], {b["batch_size"]: b["compute_infer"]["count"]
                                      for b in stats["batch_stats"]}


def test_oldest_strategy_never_batches_requests_of_different_shapes(server):
    results = _two_sequences(server, "oldest_fixed")
    assert results == [([[11, 11, 11]], 1), ([[12]], 1)]
    assert _batches(server, "oldest_fixed") == (2, {1: 2})


def test_oldest_strategy_batches_different_shapes_of_a_ragged_input(server):
    results = _two_sequences(server, "oldest_ragged")
    assert results == [([[11, 11, 11]], 2), ([[12]], 2)]
    assert _batches(server, "oldest_ragged") == (1, {2: 1})


def test_direct_strategy_pads_the_slot_of_a_request_of_another_shape(server):
    # Each execute has both slots: the request of the lowest slot's shape and a padding row for
    # the other slot, whose request runs in the next execute (with a padding row for the first).
    results = _two_sequences(server, "direct_fixed")
    assert results == [([[11, 11, 11]], 2), ([[12]], 2)]
    assert _batches(server, "direct_fixed") == (2, {2: 2})


def test_direct_strategy_batches_different_shapes_of_a_ragged_input(server):
    results = _two_sequences(server, "direct_ragged")
    assert results == [([[11, 11, 11]], 2), ([[12]], 2)]
    assert _batches(server, "direct_ragged") == (1, {2: 1})
