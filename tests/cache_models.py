"""A model repository for the response-cache tests (written into a temporary directory).

- `cached`: python backend, OUTPUT0 = INPUT0 and OUTPUT1 = 2 * INPUT0 (INT32, shape [-1, -1]),
  `response_cache { enable: true }`; a request whose first element is negative gets an error.
- `uncached`: the same model without `response_cache`.
- `decoupled_cached`, `sequence_cached`: combinations the cache refuses at load.
"""

from __future__ import annotations

from pathlib import Path

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.size and x.reshape(-1)[0] < 0:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("negative input")))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", x.copy()),
                pb_utils.Tensor("OUTPUT1", (x * 2).astype(np.int32))]))
        return responses
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1, -1 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1, -1 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ -1, -1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{extra}
'''

MODELS = {
    "cached": "response_cache { enable: true }",
    "uncached": "",
    "decoupled_cached": "model_transaction_policy { decoupled: true }\nresponse_cache { enable: true }",
    "sequence_cached": "sequence_batching { }\nresponse_cache { enable: true }",
}


def write_repository(root: Path, names: list[str] | None = None) -> Path:
    for name in names or list(MODELS):
        version = root / name / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(MODEL_PY)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=MODELS[name]))
    return root
