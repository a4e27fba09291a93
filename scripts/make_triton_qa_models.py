"""Write python-backend stand-ins for the models Triton's QA tests (server repo, qa/L0_*) expect.

    python scripts/make_triton_qa_models.py OUT_DIR

Triton's QA builds its identity models as ONNX/TensorRT files (qa/common/gen_qa_identity_models.py)
that are not published. This writes models with the same names, configs, inputs and outputs as
python-backend identity models, enough for L0_http/http_test.py and L0_grpc's python tests to run
against `modelhost serve` (see docs/conformance.md). Not used by CI; fetches nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

IDENTITY = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outs = [pb_utils.Tensor(t.name().replace("INPUT", "OUTPUT"), t.as_numpy())
                    for t in request.inputs()]
            responses.append(pb_utils.InferenceResponse(output_tensors=outs))
        return responses
'''


def identity(out: Path, name: str, dtype: str, dims: str, io_cnt: int = 1, max_batch: int = 8,
             extra: str = "") -> None:
    ios = []
    for kind, prefix in (("input", "INPUT"), ("output", "OUTPUT")):
        ios.append(f"{kind} [ " + ", ".join(
            f'{{ name: "{prefix}{i}" data_type: {dtype} dims: {dims} }}' for i in range(io_cnt)) + " ]")
    folder = out / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(IDENTITY)
    (out / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n' + "\n".join(ios) + "\n" + extra)


def main(out: Path) -> None:
    identity(out, "onnx_zero_1_float32", "TYPE_FP32", "[ -1 ]")
    identity(out, "onnx_zero_1_object", "TYPE_STRING", "[ -1 ]")
    identity(out, "onnx_zero_1_object_1_element", "TYPE_STRING", "[ 1 ]")
    identity(out, "onnx_zero_1_float16", "TYPE_FP16", "[ -1, -1 ]")
    identity(out, "onnx_zero_3_float32", "TYPE_FP32", "[ -1 ]", io_cnt=3)
    identity(out, "onnx_zero_1_float32_queue", "TYPE_FP32", "[ -1 ]", extra=(
        "dynamic_batching { max_queue_delay_microseconds: 1000000 preferred_batch_size: [ 8 ]\n"
        "  default_queue_policy { max_queue_size: 1 } }\n"))
    identity(out, "simple_identity", "TYPE_STRING", "[ -1 ]")
    identity(out, "simple_identity_int64", "TYPE_INT64", "[ -1 ]")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
