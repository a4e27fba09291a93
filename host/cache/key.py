"""The cache key of a request, and which requests may use the cache at all.

The key is a 128-bit digest (SHA-256, truncated) over, in this order, each variable-length part
length-prefixed so that no two different requests frame to the same byte stream:

- the model name and the resolved model version;
- every input in name order (the order the client sent them in does not matter): its name,
  datatype, shape and raw bytes (BYTES tensors in Triton's length-prefixed serialization);
- the model's own request parameters, if any (canonical JSON): a model may read them, so two
  requests that differ only there must not share a response.

The shape and the datatype are part of the key, so equal bytes read as [2, 8] and [4, 4], or as
INT32 and FP32, are different entries. Triton's key is a 64-bit hash; a 128-bit cryptographic
digest makes a collision (a request answered with another request's response) negligible by
accident and impractical on purpose. SHA-256 because it is the fastest strong hash here: CPUs
have instructions for it (about 3.5 us per 4 KiB on the development machine, BLAKE2b 7 to 11).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import orjson

from host import datatypes
from host.cache.base import KEY_BYTES

if TYPE_CHECKING:
    from host.inference import InferenceRequest

# A tensor parameter that says where its data lives; anything but "cpu" is not hashed.
DEVICE_PARAMETER = "_device"

_DOMAIN = b"modelhost response cache key v1\x00"  # change to invalidate every stored entry


def cacheable_request(request: InferenceRequest) -> bool:
    """Whether a request may be looked up and its response stored: every input must be in CPU
    memory (a numpy array on the host; system shared memory counts, CUDA memory does not)."""
    for tensor in request.inputs.values():
        if not isinstance(tensor.data, np.ndarray):  # a device array (CUDA shared memory)
            return False
        params = tensor.parameters
        if params and params.get(DEVICE_PARAMETER, "cpu") != "cpu":
            return False
    return True


def request_key(model_name: str, model_version: int, request: InferenceRequest) -> bytes:
    """The 16-byte key of `request` for the model version that serves it."""
    h = hashlib.sha256(_DOMAIN)
    inputs = request.inputs
    # Text framing: a name is preceded by its length, the rest holds no separator it could fake.
    h.update(f"{len(model_name)}:{model_name}:{model_version}:{len(inputs)}".encode())
    for name in sorted(inputs) if len(inputs) > 1 else inputs:
        tensor = inputs[name]
        data = tensor.data
        if tensor.datatype == "BYTES" or not (isinstance(data, np.ndarray) and data.flags.c_contiguous):
            data = datatypes.array_to_bytes(tensor.datatype, data)
        size = data.nbytes if isinstance(data, (np.ndarray, memoryview)) else len(data)
        h.update(f"|{len(name)}:{name}:{tensor.datatype}:{list(tensor.shape)}:{size}|".encode())
        h.update(data)  # a contiguous array is hashed in place, without a copy
    if request.parameters:
        h.update(orjson.dumps(request.parameters, option=orjson.OPT_SORT_KEYS, default=repr))
    return h.digest()[:KEY_BYTES]
