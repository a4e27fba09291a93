"""Behaviour the python_backend examples (examples/ of triton-inference-server/python_backend, run
by Triton's qa/L0_backend_python/examples) depend on, with models of our own, checked against
Triton 2.51 side by side:

- BLS: a model name given as bytes (an element of a BYTES input's `as_numpy()`, as the bls
  example passes it) names the model; an unknown one fails with Triton's text, the name as text;
- an output whose datatype differs from config.pbtxt is sent as the model made it (the
  bls_decoupled example sums into an INT64 array for a TYPE_INT32 output);
- `pb_utils.MetricFamily` / `Metric` are exported on /metrics (custom_metrics example): one family
  per name, one value per label set, histograms as `_bucket`/`_sum`/`_count`;
- input arrays are writable (a model may change them in place, as torch models do with
  `torch.as_tensor(x.as_numpy())`), whichever way the request carried them.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from host.testing import serve

pytestmark = pytest.mark.modelhost_only

MODELS = {
    "twice": ("""
        input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
        """, """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", pb_utils.get_input_tensor_by_name(r, "A").as_numpy() * 2)])
                    for r in requests]
        """),
    "by_name": ("""
        input [ { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] },
                { name: "A" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
        """, """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for r in requests:
                    name = pb_utils.get_input_tensor_by_name(r, "NAME").as_numpy()[0]  # bytes
                    call = pb_utils.InferenceRequest(
                        model_name=name, requested_output_names=[b"OUT"],
                        inputs=[pb_utils.get_input_tensor_by_name(r, "A")])
                    answer = call.exec()
                    if answer.has_error():
                        raise pb_utils.TritonModelException(answer.error().message())
                    responses.append(pb_utils.InferenceResponse(answer.output_tensors()))
                return responses
        """),
    "widened": ("""
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """, """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for r in requests:
                    total = np.array([0])  # int64
                    total += pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                    responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", total)]))
                return responses
        """),
    "in_place": ("""
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] },
                 { name: "WRITABLE" data_type: TYPE_BOOL dims: [ 1 ] } ]
        """, """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                responses = []
                for r in requests:
                    tensor = pb_utils.get_input_tensor_by_name(r, "IN")
                    array = tensor.as_numpy()
                    writable = array.flags.writeable
                    array += 1
                    again = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()  # the change
                    responses.append(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", again),
                        pb_utils.Tensor("WRITABLE", np.array([writable]))]))
                return responses
        """),
    "metered": ("""
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
        """, """
        import json
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                counter = pb_utils.MetricFamily.COUNTER
                self.families = [
                    pb_utils.MetricFamily(name="qa_ex_requests", description="Requests seen",
                                          kind=counter),
                    # the same family: its description is not used
                    pb_utils.MetricFamily(name="qa_ex_requests", description="another text",
                                          kind=counter)]
                self.counters = [f.Metric(labels={"model": "metered"}) for f in self.families]
                self.other = self.families[0].Metric(labels={"model": "metered", "kind": "x"})
                self.families.append(pb_utils.MetricFamily(
                    name="qa_ex_last", description="Last request size",
                    kind=pb_utils.MetricFamily.GAUGE))
                self.gauge = self.families[-1].Metric(labels={"model": "metered"})
                self.families.append(pb_utils.MetricFamily(
                    name="qa_ex_sizes", description="Request sizes",
                    kind=pb_utils.MetricFamily.HISTOGRAM))
                self.sizes = self.families[-1].Metric(
                    labels={"model": "metered"}, buckets=[1.0, 2.5])
                self.errors = {}
                try:
                    pb_utils.MetricFamily(name="qa_ex_requests", description="x",
                                          kind=pb_utils.MetricFamily.GAUGE)
                except Exception as e:
                    self.errors["clash"] = str(e)
                gone = pb_utils.MetricFamily(name="qa_ex_gone", description="Never shown",
                                             kind=counter)
                orphan = gone.Metric(labels={"model": "metered"})
                del gone  # its metrics are cleared with it
                for name, call in [("increment", lambda: orphan.increment(1)),
                                   ("value", orphan.value)]:
                    try:
                        call()
                    except Exception as e:
                        self.errors[name] = str(e)

            def execute(self, requests):
                responses = []
                for r in requests:
                    size = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().size
                    for counter in self.counters:
                        counter.increment(1)
                    self.gauge.set(size)
                    self.sizes.observe(size)
                    text = json.dumps({"shared": self.counters[1].value(),
                                       "other": self.other.value(), **self.errors})
                    responses.append(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", np.array([text.encode()], dtype=np.object_))]))
                return responses
        """),
    "metric_errors": ("""
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
        """, """
        import json
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                kinds = pb_utils.MetricFamily
                counter = kinds(name="qa_err_c", description="c", kind=kinds.COUNTER)
                gauge = kinds(name="qa_err_g", description="g", kind=kinds.GAUGE)
                histogram = kinds(name="qa_err_h", description="h", kind=kinds.HISTOGRAM)
                c, g = counter.Metric(), gauge.Metric()
                h = histogram.Metric(labels={"n": "1"}, buckets=[1.0])
                probes = {
                    "counter_set": lambda: c.set(1),
                    "counter_observe": lambda: c.observe(1),
                    "gauge_observe": lambda: g.observe(1),
                    "histogram_increment": lambda: h.increment(1),
                    "histogram_set": lambda: h.set(1),
                    "no_buckets": lambda: histogram.Metric(labels={"n": "2"}),
                    "counter_buckets": lambda: counter.Metric(buckets=[1.0]),
                    "repeated_bound": lambda: histogram.Metric(labels={"n": "3"},
                                                               buckets=[1, 1, 2]),
                    "label_value": lambda: counter.Metric(labels={"a": 1}),
                    "label_name": lambda: counter.Metric(labels={1: "a"}),
                    "family_name": lambda: kinds(name="bad name", description="x",
                                                 kind=kinds.COUNTER),
                }
                errors = {}
                for key, probe in probes.items():
                    try:
                        probe()
                        errors[key] = "accepted"
                    except Exception as e:
                        errors[key] = f"{type(e).__name__}: {e}"
                text = json.dumps(errors).encode()
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", np.array([text], dtype=np.object_))]) for r in requests]
        """),
    "odd_import": ("""
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """, """
        import sys
        import types

        import numpy as np
        import triton_python_backend_utils as pb_utils


        class _AnyAttribute(types.ModuleType):
            # as torch.classes, whose __getattr__ answers __path__ with a namespace object
            def __getattr__(self, name):
                if name == "__path__":
                    return object()
                raise AttributeError(name)


        sys.modules["qa_examples_any_attribute"] = _AnyAttribute("qa_examples_any_attribute")


        class TritonPythonModel:
            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))])
                        for r in requests]
        """),
}


def write_models(root: str | Path) -> Path:
    root = Path(root)
    for name, (config, code) in MODELS.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(config))
        (root / name / "1" / "model.py").write_text(textwrap.dedent(code))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(write_models(tmp_path_factory.mktemp("qa_examples"))) as s:
        yield s


@pytest.fixture(scope="module")
def clients(server):
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    yield [(httpclient, http), (grpcclient, grpc)]
    http.close()
    grpc.close()


def _input(mod, name: str, array: np.ndarray, binary: bool = True):
    datatype = "BYTES" if array.dtype == np.object_ else {
        np.float32: "FP32", np.int32: "INT32"}[array.dtype.type]
    tensor = mod.InferInput(name, list(array.shape), datatype)
    if mod is httpclient:
        tensor.set_data_from_numpy(array, binary_data=binary)
    else:
        tensor.set_data_from_numpy(array)
    return tensor


def test_bls_model_name_given_as_bytes(clients):
    a = np.array([1.0, 2.5], dtype=np.float32)
    for mod, client in clients:
        result = client.infer("by_name", [_input(mod, "NAME", np.array([b"twice"], np.object_)),
                                          _input(mod, "A", a)])
        assert result.as_numpy("OUT").tolist() == [2.0, 5.0]
        with pytest.raises(InferenceServerException) as info:
            client.infer("by_name", [_input(mod, "NAME", np.array([b"absent"], np.object_)),
                                     _input(mod, "A", a)])
        message = info.value.message()
        # The name as text (Triton 2.51 goes on "Failed for execute the inference request. Model
        # 'absent' is not ready."; newer ones with the core's lookup error).
        assert "TritonModelException: Model absent - Error when running inference: " in message
        assert "'absent'" in message and "b'absent'" not in message


def test_output_datatype_is_the_models_not_the_configs(clients):
    for mod, client in clients:
        result = client.infer("widened", [_input(mod, "IN", np.array([7], np.int32))])
        assert result.as_numpy("SUM").dtype == np.int64
        assert result.as_numpy("SUM").tolist() == [7]


@pytest.mark.parametrize("binary", [True, False])
def test_inputs_are_writable_in_place(clients, binary):
    for mod, client in clients:
        result = client.infer("in_place", [_input(mod, "IN", np.array([1, 2], np.int32), binary)])
        assert result.as_numpy("WRITABLE").tolist() == [True]
        assert result.as_numpy("OUT").tolist() == [2, 3]


def test_custom_metrics_are_exported(server, clients):
    mod, client = clients[0]
    answers = [json.loads(client.infer("metered", [_input(mod, "IN", np.zeros(n, np.float32))]
                                       ).as_numpy("OUT")[0]) for n in (1, 3)]
    # Two Metric objects of one family with the same labels share one value.
    assert [(a["shared"], a["other"]) for a in answers] == [(2, 0), (4, 0)]
    cleared = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
               "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects "
               "have been deleted.")
    assert answers[0]["increment"] == "Failed to increment metric value: " + cleared
    assert answers[0]["value"] == "Failed to get metric value: " + cleared
    assert answers[0]["clash"] == (  # another kind under a family's name
        "Error when creating MetricFamily: Failed to process the request for model 'metered_0', "
        "message: Family name already exists with different type")
    metrics = requests.get(server.metrics_url, timeout=10).text
    for line in [
        "# HELP qa_ex_requests Requests seen",
        "# TYPE qa_ex_requests counter",
        'qa_ex_requests{model="metered"} 4',
        'qa_ex_requests{kind="x",model="metered"} 0',
        "# HELP qa_ex_last Last request size",
        "# TYPE qa_ex_last gauge",
        'qa_ex_last{model="metered"} 3',
        "# HELP qa_ex_sizes Request sizes",
        "# TYPE qa_ex_sizes histogram",
        'qa_ex_sizes_count{model="metered"} 2',
        'qa_ex_sizes_sum{model="metered"} 4',
        'qa_ex_sizes_bucket{model="metered",le="1"} 1',
        'qa_ex_sizes_bucket{model="metered",le="2.5"} 1',
        'qa_ex_sizes_bucket{model="metered",le="+Inf"} 2',
    ]:
        assert line + "\n" in metrics, line
    assert "another text" not in metrics and "qa_ex_gone" not in metrics
    sizes = [line.split("{")[0] for line in metrics.splitlines() if line.startswith("qa_ex_sizes")]
    assert sizes == ["qa_ex_sizes_count", "qa_ex_sizes_sum"] + ["qa_ex_sizes_bucket"] * 3


def test_custom_metric_errors_have_tritons_texts(clients):
    """Each text as Triton 2.51 gives it, checked one probe per request there (several failing
    metric calls in one execute crash its server)."""
    mod, client = clients[0]
    errors = json.loads(client.infer("metric_errors", [_input(
        mod, "IN", np.zeros(1, np.float32))]).as_numpy("OUT")[0])
    core = "TritonModelException: {}: Failed to process the request for model 'metric_errors_0', " \
           "message: {}"
    assert errors == {
        "counter_set": core.format("Failed to set metric value",
                                   "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
        "counter_observe": core.format("Failed to observe metric value",
                                       "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"),
        "gauge_observe": core.format("Failed to observe metric value",
                                     "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"),
        "histogram_increment": core.format(
            "Failed to increment metric value",
            "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"),
        "histogram_set": core.format("Failed to set metric value",
                                     "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set"),
        "no_buckets": "TritonModelException: Failed to create metric. Missing required buckets.",
        "counter_buckets": "TritonModelException: Failed to create metric. Unexpected buckets "
                           "found.",
        "repeated_bound": core.format("Error when creating Metric",
                                      "Bucket Boundaries must be strictly sorted"),
        "label_value": core.format("Error when creating Metric",
                                   "attempt to access JSON non-string as string"),
        "label_name": core.format("Error when creating Metric", "Invalid label name"),
        "family_name": core.format("Error when creating MetricFamily", "Invalid metric name"),
    }


def test_a_model_importing_a_module_that_answers_any_attribute_loads(clients):
    """torch (imported first by a model, as the pytorch example does in a stub process) has
    torch.classes, whose __path__ is not iterable: the model still loads."""
    for mod, client in clients:
        assert client.infer("odd_import", []).as_numpy("OUT").tolist() == [1]
