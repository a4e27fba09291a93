"""The cache key of a request, and which requests may use the cache at all.

The key is a 128-bit BLAKE2b digest over, in this order and each length-prefixed so that no two
different requests frame to the same byte stream:

- the model name and the resolved model version;
- every input in name order (the order the client sent them in does not matter): its name,
  datatype, shape and raw bytes (BYTES tensors in Triton's length-prefixed serialization);
- the model's own request parameters, if any (canonical JSON): a model may read them, so two
  requests that differ only there must not share a response.

The shape and the datatype are part of the key, so equal bytes read as [2, 8] and [4, 4], or as
INT32 and FP32, are different entries. (Triton's key is a 64-bit hash; a 128-bit digest makes an
accidental collision, which would answer a request with another request's response, negligible.)
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING

import orjson

from host import datatypes
from host.cache.base import KEY_BYTES

if TYPE_CHECKING:
    from host.inference import InferenceRequest, Tensor

# A tensor parameter that says where its data lives; anything but "cpu" is not hashed.
DEVICE_PARAMETER = "_device"

_PERSON = b"modelhost-cache1"  # BLAKE2b personalization: bump to invalidate every stored entry
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


def cacheable_request(request: InferenceRequest) -> bool:
    """Whether a request may be looked up and its response stored: every input must be in CPU
    memory (a numpy array on the host; system shared memory counts, CUDA memory does not)."""
    for tensor in request.inputs.values():
        params = tensor.parameters
        if params and params.get(DEVICE_PARAMETER, "cpu") != "cpu":
            return False
    return True


def request_key(model_name: str, model_version: int, request: InferenceRequest) -> bytes:
    """The 16-byte key of `request` for the model version that serves it."""
    h = hashlib.blake2b(digest_size=KEY_BYTES, person=_PERSON)
    _text(h, model_name)
    h.update(_I64.pack(model_version))
    inputs = request.inputs
    h.update(_U32.pack(len(inputs)))
    for name in sorted(inputs):
        _tensor(h, inputs[name])
    if request.parameters:
        h.update(orjson.dumps(request.parameters, option=orjson.OPT_SORT_KEYS, default=repr))
    return h.digest()


def _text(h: hashlib._Hash, text: str) -> None:
    raw = text.encode("utf-8")
    h.update(_U32.pack(len(raw)))
    h.update(raw)


def _tensor(h: hashlib._Hash, tensor: Tensor) -> None:
    _text(h, tensor.name)
    _text(h, tensor.datatype)
    shape = tensor.shape
    h.update(_U32.pack(len(shape)))
    h.update(struct.pack(f"<{len(shape)}q", *shape))
    data = datatypes.array_to_bytes(tensor.datatype, tensor.data)
    h.update(_U64.pack(len(data)))
    h.update(data)
