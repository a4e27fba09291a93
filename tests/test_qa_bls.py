"""Behaviours Triton's L0_backend_python bls/ensemble/decoupled QA relies on (models written here).

- a model that runs `unittest.main("model", exit=False)` in `execute` (or `initialize`) finds its
  own model.py (Triton appends the version directory to `sys.path`), with `sys.argv == [""]`;
  two models doing so each get their own file;
- an output whose datatype differs from its configuration is sent as the model made it;
- BLS to an unknown model answers with the core's lookup error (current Triton);
- `pb_utils.unload_model` from `initialize` returns (and the model is no longer ready).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from host.testing import serve

pytestmark = pytest.mark.modelhost_only

UNITTEST_MODEL = '''
import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils

WHO = "{who}"


class SelfTest(unittest.TestCase):
    def test_own_file(self):
        import model  # the module unittest.main("model") imported: this same file
        self.assertEqual(model.WHO, "{who}")

    def test_argv(self):
        self.assertEqual(sys.argv, [""])

    def test_bls_unknown_model(self):
        request = pb_utils.InferenceRequest(
            model_name="nope", inputs=[], requested_output_names=["OUT"])
        response = request.exec()
        self.assertTrue(response.has_error())
        self.assertEqual(
            response.error().message(),
            "Model nope - Error when running inference: Request for unknown model: "
            "'nope' is not found")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for _ in requests:
            test = unittest.main("model", exit=False)
            # float16 although the configuration says FP32: Triton sends it as made
            ok = np.array([test.result.wasSuccessful()], dtype=np.float16)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", ok)]))
        return responses
'''

UNITTEST_CONFIG = '''
backend: "python"
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
'''

TARGET_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests]
'''

TARGET_CONFIG = '''
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

LOADER_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        steps = [pb_utils.is_model_ready("target")]
        pb_utils.load_model("target")
        steps.append(pb_utils.is_model_ready("target"))
        pb_utils.unload_model("target")
        steps.append(pb_utils.is_model_ready("target"))
        self.steps = json.dumps(steps)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", np.array([self.steps], dtype=object))])
            for _ in requests]
'''

LOADER_CONFIG = '''
backend: "python"
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


def _write(root: Path, name: str, config: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("qa_bls")
    for who in ("first", "second"):
        _write(root, f"selftest_{who}", UNITTEST_CONFIG, UNITTEST_MODEL.format(who=who))
    _write(root, "target", TARGET_CONFIG, TARGET_MODEL)
    _write(root, "loader", LOADER_CONFIG, LOADER_MODEL)
    with serve(root, "--model-control-mode", "explicit", "--load-model", "selftest_first",
               "--load-model", "selftest_second") as s:
        yield s


def test_unittest_main_in_execute_runs_each_models_own_tests(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # Alternating: a cached `model` of one model must not answer the other's import.
    for name in ("selftest_first", "selftest_second", "selftest_first", "selftest_second"):
        result = client.infer(name, [])
        out = result.as_numpy("OUTPUT0")
        assert out.dtype == np.float16 and out.tolist() == [1.0], name
        assert result.get_output("OUTPUT0").datatype == "FP16"


def test_output_datatype_is_the_models_over_http(server):
    client = httpclient.InferenceServerClient(server.url)
    result = client.infer("selftest_first", [])
    assert result.get_output("OUTPUT0")["datatype"] == "FP16"
    assert result.get_output("OUTPUT0")["shape"] == [1]


def test_unload_model_from_initialize_returns(server):
    client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
    client.load_model("loader")
    result = client.infer("loader", [])
    assert json.loads(result.as_numpy("OUTPUT0")[0]) == [False, True, False]
    assert not client.is_model_ready("target")
    assert client.is_server_live()
