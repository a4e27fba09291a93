import numpy as np
import triton_python_backend_utils as pb_utils

TYPES = {"UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
         "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
         "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BOOL": np.bool_}


class TritonPythonModel:
    """INPUT0 (FP64) cast to every datatype: OUT_<TYPE>; OUT_BYTES holds each value as text."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            outs = [pb_utils.Tensor(f"OUT_{name}", x.astype(dtype)) for name, dtype in TYPES.items()]
            text = np.array([str(v).encode() for v in x.reshape(-1)], dtype=np.object_)
            outs.append(pb_utils.Tensor("OUT_BYTES", text.reshape(x.shape)))
            responses.append(pb_utils.InferenceResponse(output_tensors=outs))
        return responses
