"""`triton_python_backend_utils` for in-process models: the API a Triton python-backend
`model.py` imports as `pb_utils`.

Triton builds this module from two halves (a Python file and a C++ extension that the stub
process injects); here it is one Python module with the same public names and behaviour. The
backend (`host.backends.python.backend`) wraps the host's requests in these classes and
converts the responses a model returns or sends back into host responses.

Differences from Triton (all documented in the backend's module docstring):

- BF16 tensors: `as_numpy()` raises as in Triton (use `to_dlpack`/`from_dlpack`), but an
  `ml_dtypes.bfloat16` numpy array can be passed to `Tensor(...)` (Triton has no such array).
- Tensors always live in CPU memory. `from_dlpack` of a GPU tensor copies it to the host when the
  object has a `.cpu()` method (torch), and raises otherwise.
- BLS (`InferenceRequest(...).exec()` / `async_exec()`) and model control (`load_model`,
  `unload_model`, `is_model_ready`) go to the host in this process (`host.backends.python.bls`),
  or from a process-mode stub to the server's;
  BLS responses carry the callee's `parameters()` (newer Tritons do too).
- Custom metrics (`MetricFamily`) are exported on /metrics as Triton's
  (host.backends.python.custom_metrics), a process-mode instance's too.
- `as_numpy()` of a request input (or BLS output) is writable as in Triton: a read-only view of
  the request's bytes is copied once, on first use.
"""

from __future__ import annotations

import contextvars
import ctypes
import enum
import json
import logging
import re
import sys
import threading
import weakref
from typing import Any, Callable

import numpy as np

from host import datatypes
from host.backends.python import bls as _bls  # uses this module only inside its functions
from host.proto import model_config_pb2

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE", "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU",
    "TRITON_STRING_TO_NUMPY",
    "TritonError", "TritonModelException", "Tensor", "InferenceRequest", "InferenceResponse",
    "InferenceResponseSender", "ResponseIterator", "InferenceTrace", "PreferredMemory", "MemoryType",
    "Logger", "ModelConfig", "MetricFamily", "Metric",
    "get_input_tensor_by_name", "get_output_tensor_by_name", "get_input_config_by_name",
    "get_output_config_by_name", "using_decoupled_model_transaction_policy",
    "triton_to_numpy_type", "numpy_to_triton_type", "triton_string_to_numpy",
    "serialize_byte_tensor", "deserialize_bytes_tensor", "get_model_dir",
    "load_model", "unload_model", "is_model_ready",
]

# --- constants (TRITONSERVER_* values, as Triton's utils define them) ------------------------

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


# --- per-model context: which model is calling a module-level function -----------------------

class _ModelContext:
    """What module-level functions (`get_model_dir`, `Logger`) need to know about the caller."""

    def __init__(self, model_name: str, model_dir: str) -> None:
        self.model_name = model_name
        self.model_dir = model_dir
        self.logger = logging.getLogger(f"host.models.{model_name}")
        self.instance_name = ""  # set by the backend for an instance's context
        # Between the end of initialize and the start of finalize: when BLS calls are allowed.
        self.serving = False


# Set by the backend around every call into a model (import, initialize, execute, finalize).
_ACTIVE: contextvars.ContextVar[_ModelContext | None] = contextvars.ContextVar(
    "modelhost_python_model", default=None)
# The backend stores the context under this name in the globals of a model's modules, so that
# threads the model starts itself (where the context variable is unset) are attributed too.
CONTEXT_GLOBAL = "__modelhost_context__"


def _current_context() -> _ModelContext | None:
    frame: Any = sys._getframe(1)
    while frame is not None:
        ctx = frame.f_globals.get(CONTEXT_GLOBAL)
        if isinstance(ctx, _ModelContext):
            return ctx
        frame = frame.f_back
    return _ACTIVE.get()


def get_model_dir() -> str:
    """The directory that holds the calling model's `model.py` (its version directory)."""
    ctx = _current_context()
    if ctx is None:
        raise TritonModelException("get_model_dir() must be called from a python-backend model")
    return ctx.model_dir


# --- errors ----------------------------------------------------------------------------------

class TritonModelException(Exception):
    """Raised by this API on misuse; a model may raise it too (any exception fails the batch)."""

    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def __str__(self) -> str:
        return self._msg

    def message(self) -> str:
        return self._msg


class _ErrorCode(enum.IntEnum):
    """TRITONSERVER_Error_Code values."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error a model puts in an `InferenceResponse`; `code` is one of the class constants."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = _ErrorCode.INTERNAL) -> None:
        if message is None or code is None:
            raise TypeError("TritonError(message, code): neither may be None")
        try:
            self._code = _ErrorCode(int(code))
        except ValueError:
            raise TritonModelException(f"invalid TritonError code {code!r}") from None
        self._msg = str(message)

    def code(self) -> _ErrorCode:
        return self._code

    def message(self) -> str:
        return self._msg

    def __str__(self) -> str:
        return self._msg

    def __repr__(self) -> str:
        return f"TritonError({self._msg!r}, code=TritonError.{self._code.name})"


# --- datatypes -------------------------------------------------------------------------------

_DataType = model_config_pb2.DataType  # TYPE_* enum: the same numbers as TRITONSERVER_DataType


def _type_code(datatype: str) -> int:
    """`FP32` -> 11 (TRITONSERVER_TYPE_FP32)."""
    return _DataType.Value(datatypes.to_config(datatype))


def _datatype_of_code(code: int) -> str:
    """11 -> `FP32`."""
    return datatypes.from_config(_DataType.Name(int(code)))


def triton_to_numpy_type(data_type: int) -> Any:
    """TRITONSERVER_DataType number -> numpy scalar type (13, BYTES -> np.object_); None if unknown."""
    try:
        return datatypes.to_numpy(_datatype_of_code(data_type)).type
    except Exception:
        return None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy dtype or scalar type -> TRITONSERVER_DataType number; None if it has none."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind == "U":  # Triton has no mapping for unicode arrays: use np.object_
        return None
    try:
        return _type_code(datatypes.from_numpy(dtype))
    except Exception:
        return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """`TYPE_FP32` (model config data_type) -> numpy scalar type; KeyError if unknown."""
    try:
        return datatypes.to_numpy(datatypes.from_config(triton_type_string)).type
    except Exception:
        raise KeyError(triton_type_string) from None


# Triton's table of config type names to numpy types, derived from host.datatypes.
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    name: triton_to_numpy_type(_DataType.Value(name)) for name in _DataType.keys()
    if triton_to_numpy_type(_DataType.Value(name)) is not None}


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple | None:
    """Triton's length-prefixed serialization of an object/bytes array ('C' order)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        return datatypes.serialize_bytes(_bytes_items(input_tensor))
    return None


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Inverse of `serialize_byte_tensor`: a 1-D object array of `bytes`."""
    items = datatypes.deserialize_bytes(encoded_tensor)
    return datatypes.bytes_array(items, [len(items)])


def _bytes_items(array: np.ndarray) -> list[bytes]:
    """Flattened elements of a BYTES array as `bytes` (str -> UTF-8, other objects -> str())."""
    if array.dtype.kind == "S":
        return array.reshape(-1).tolist()  # numpy drops trailing NULs of 'S' items, as in Triton
    out = []
    for item in array.reshape(-1).tolist():
        if isinstance(item, (bytes, bytearray, memoryview)):
            out.append(bytes(item))
        elif isinstance(item, str):
            out.append(item.encode("utf-8"))
        else:
            out.append(str(item).encode("utf-8"))
    return out


def _as_bytes_object_array(array: np.ndarray) -> np.ndarray:
    """A BYTES array as the host wants it: an object array of `bytes`, same shape."""
    if array.dtype == np.object_ and all(type(x) is bytes for x in array.reshape(-1).tolist()):
        return array
    return datatypes.bytes_array(_bytes_items(array), array.shape)


# --- DLPack ----------------------------------------------------------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_kDLCPU, _kDLCUDA, _kDLCUDAHost = 1, 2, 3
_kDLUInt, _kDLBfloat = 1, 4
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _managed_tensor(capsule: Any) -> _DLManagedTensor:
    if not _capsule_is_valid(capsule, b"dltensor"):
        raise TritonModelException(
            "Provided tensor is not supported. Tensor must be an unused DLPack capsule "
            "or have `__dlpack__` and `__dlpack_device__` attributes")
    return _DLManagedTensor.from_address(_capsule_get_pointer(capsule, b"dltensor"))


class _CapsuleHolder:
    """Lets numpy's `from_dlpack` consume a bare capsule."""

    def __init__(self, capsule: Any, device: tuple[int, int]) -> None:
        self._capsule, self._device = capsule, device

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def _array_from_capsule(capsule: Any) -> np.ndarray:
    managed = _managed_tensor(capsule)
    device = (managed.dl_tensor.device.device_type, managed.dl_tensor.device.device_id)
    if device[0] not in (_kDLCPU, _kDLCUDAHost):
        raise TritonModelException(
            "DLPack tensor is in GPU memory: the in-process python backend keeps tensors in "
            "CPU memory; move it to the CPU first")
    bf16 = managed.dl_tensor.dtype.code == _kDLBfloat
    if bf16:
        if managed.dl_tensor.dtype.bits != 16:
            raise TritonModelException(
                f"Expected BF16 tensor to have 16 bits, but had: {managed.dl_tensor.dtype.bits}")
        if datatypes.BF16_DTYPE is None:
            raise TritonModelException("BF16 tensors need the ml_dtypes package")
        managed.dl_tensor.dtype.code = _kDLUInt  # numpy reads it as uint16; viewed as bf16 below
    array = np.from_dlpack(_CapsuleHolder(capsule, (_kDLCPU, 0)))
    return array.view(datatypes.BF16_DTYPE) if bf16 else array  # type: ignore[arg-type]


def _capsule_from_array(array: np.ndarray) -> Any:
    if not array.flags.writeable:
        # A request input over the read-only request body: numpy cannot signal read-only in a
        # legacy (unversioned) capsule, which is what consumers such as torch ask for.
        array = array.copy()
    if array.dtype == datatypes.BF16_DTYPE:
        capsule = array.view(np.uint16).__dlpack__()
        _managed_tensor(capsule).dl_tensor.dtype.code = _kDLBfloat
        return capsule
    return array.__dlpack__()


def _incompatible(function: str, signature: str) -> TypeError:
    """The TypeError Triton's pybind11 bindings raise for arguments of the wrong type."""
    return TypeError(f"{function}(): incompatible function arguments. The following argument "
                     f"types are supported:\n    1. {signature}\n")


# --- tensors ---------------------------------------------------------------------------------

class Tensor:
    """A named tensor over a numpy array (inputs are views of the request's data, never copies)."""

    __slots__ = ("_name", "_array", "_datatype", "_borrowed")

    def __init__(self, name: str, numpy_array: Any) -> None:
        if not isinstance(name, (str, bytes)) or numpy_array is None:
            raise _incompatible("__init__", "Tensor(name: str, numpy_array: numpy.ndarray)")
        if type(name) is not str:
            name = _std_string(name)
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        datatype = _FIXED_BY_DTYPE.get(array.dtype) or _datatype_of_array(array)
        if datatype is None:
            raise TritonModelException(
                f"Tensor '{name}': NumPy dtype {array.dtype} is not supported"
                + (" (use np.object_ for strings)." if array.dtype.kind == "U" else "."))
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array = array
        self._datatype = datatype
        self._borrowed = False

    @classmethod
    def _wrap(cls, name: str, datatype: str, array: np.ndarray, borrowed: bool = True) -> Tensor:
        """A request input or BLS output (borrowed: the host's data): no checks, no copy."""
        t = cls.__new__(cls)
        t._name, t._array, t._datatype, t._borrowed = name, array, datatype, borrowed
        return t

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The numpy array; BYTES: an object array of `bytes`. BF16 raises, as in Triton."""
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and "
                "from_dlpack() instead.")
        array = self._array
        if self._borrowed and not array.flags.writeable:
            # Triton's stub hands out inputs a model may write to (in place: `x += 1`); one read
            # from a request body is a read-only view, copied once here, on first use.
            array = self._array = array.copy()
        return array

    def triton_dtype(self) -> int:
        return _type_code(self._datatype)

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        return _capsule_from_array(self._array)

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_kDLCPU, 0)

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """A tensor over a DLPack capsule or an object with `__dlpack__` (torch, numpy, ...)."""
        if not isinstance(name, str) or name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        if type(tensor).__name__ == "PyCapsule":
            array = _array_from_capsule(tensor)
        elif hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__"):
            device_type = tensor.__dlpack_device__()[0]
            if device_type not in (_kDLCPU, _kDLCUDAHost):
                if not hasattr(tensor, "cpu"):
                    raise TritonModelException(
                        f"DLDevice type {device_type} is not supported by the in-process python "
                        "backend: tensors must be in CPU memory")
                tensor = tensor.cpu()  # e.g. a CUDA torch tensor: copy it to the host
            if isinstance(tensor, np.ndarray):
                array = tensor
            else:
                array = _array_from_capsule(tensor.__dlpack__())
        else:
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                "`__dlpack__` and `__dlpack_device__` attributes")
        if not array.flags.c_contiguous:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored "
                "in C-Order are supported.")
        datatype = _datatype_of_array(array)
        if datatype is None or datatype == "BYTES":
            raise TritonModelException(f"DLPack dtype {array.dtype} is not supported.")
        return Tensor._wrap(name, datatype, array, borrowed=False)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, shape={self.shape()})"


def _borrowed_inputs(inputs: dict[str, Any], on_host: Callable[[Any], np.ndarray]) -> list[Tensor]:
    """A host request's inputs as the model sees them: views of the host's data, no copy and no
    checks (`Tensor._wrap` inlined: one call for the request rather than one per input).
    `on_host` brings data that is not a numpy array (a device array) to the host."""
    new = Tensor.__new__
    wrapped = []
    for name, t in inputs.items():
        data = t.data
        w = new(Tensor)
        w._name = name
        w._array = data if type(data) is np.ndarray else on_host(data)
        w._datatype = t.datatype
        w._borrowed = True
        wrapped.append(w)
    return wrapped


_FIXED_BY_DTYPE = datatypes.FIXED_BY_DTYPE  # the common case of a new tensor: one lookup


def _datatype_of_array(array: np.ndarray) -> str | None:
    if array.dtype.kind == "U" or array.dtype.kind == "V" and array.dtype != datatypes.BF16_DTYPE:
        return None
    try:
        return datatypes.from_numpy(array.dtype)
    except Exception:
        return None


# --- requests --------------------------------------------------------------------------------

class PreferredMemory:
    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU,
                 preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    def __init__(self, context: str | None = None) -> None:
        self._context = context

    def get_context(self) -> str | None:
        return self._context or None


def _parameters_json(parameters: dict | None) -> str:
    """Triton's PyParametersToJSON: keys str, values bool/int/str."""
    if not parameters:
        if parameters is None or isinstance(parameters, dict):
            return "{}"  # the common case: no JSON work per response
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return json.dumps(parameters)


def _std_string(value: Any) -> Any:
    """A std::string argument as pybind11 takes it: bytes (say an element of a BYTES input's
    as_numpy(), as Triton's BLS example passes a model name) count as their UTF-8 text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


_SENDER_MAKING = threading.Lock()  # a request's sender is made once (_response_sender)


class InferenceRequest:
    """An inference request as a model sees it.

    The backend builds these for `execute`; a model builds one itself to call another model
    (BLS) with `exec()` or `await async_exec()` (host.backends.python.bls).
    """

    def __init__(self, request_id: str = "", correlation_id: int | str = 0, inputs: Any = None,
                 requested_output_names: Any = None, model_name: str | None = None,
                 model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: PreferredMemory | None = None,
                 trace: InferenceTrace | None = None, parameters: dict | None = None) -> None:
        # Triton's binding (pybind11) takes no None for these and converts each by its type: a
        # mismatch is a TypeError; a None input tensor and an empty output name get through it
        # and are refused by the request itself (TritonModelException, Triton's texts).
        if (not isinstance(request_id, (str, bytes)) or correlation_id is None
                or not isinstance(inputs, (list, tuple))
                or not isinstance(requested_output_names, (list, tuple))
                or not all(isinstance(n, (str, bytes)) for n in requested_output_names)
                or not isinstance(model_name, (str, bytes))
                or not all(isinstance(v, int) for v in (model_version, flags, timeout))
                or not all(t is None or isinstance(t, Tensor) for t in inputs)):
            raise _incompatible("__init__", "InferenceRequest(request_id: str = '', "
                                "correlation_id: object = 0, inputs: List[Tensor], "
                                "requested_output_names: List[str], model_name: str, "
                                "model_version: int = -1, flags: int = 0, timeout: int = 0, "
                                "preferred_memory: PreferredMemory = ..., "
                                "trace: InferenceTrace = ..., parameters: object = None)")
        if not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        request_id, model_name = _std_string(request_id), _std_string(model_name)
        for t in inputs:
            if t is None:
                raise TritonModelException(
                    f"Input tensor for request with id '{request_id}' and model name "
                    f"'{model_name}' should not be empty.")
        for n in requested_output_names:
            if n in ("", b""):
                raise TritonModelException(
                    f"Requested output name for request with id '{request_id}' and model name "
                    f"'{model_name}' should not be empty.")
        self._preferred_memory = preferred_memory or PreferredMemory()
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested_output_names = [_std_string(n) for n in requested_output_names]
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = _parameters_json(parameters)
        self._trace: InferenceTrace | None = trace or InferenceTrace()
        self._cancelled: Callable[[], bool] = lambda: False
        self._sender: InferenceResponseSender | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    # The sender of a request the backend made (`_incoming`) is made on first use: most models
    # answer by returning their responses and never ask for it. `_sender_closed`: the request's
    # response went out before the model asked for its sender (the sender comes closed).
    _make_sender: Callable[[], InferenceResponseSender] | None = None
    _sender_closed = False

    # Fields an incoming request shares with every other until someone sets them (the class's
    # values): fewer stores per request on the path every python-model request takes.
    _trace: InferenceTrace | None = None  # made by trace() when a model asks
    _sender: InferenceResponseSender | None = None
    _release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _incoming(cls, request_id: str, correlation_id: int | str, inputs: list[Tensor],
                  requested_output_names: list[str], model_name: str, model_version: int,
                  flags: int, timeout: int, parameters: str, cancelled: Callable[[], bool],
                  make_sender: Callable[[], InferenceResponseSender]) -> InferenceRequest:
        """A request the backend hands to `execute` (parameters already JSON). Positional: it
        is made for every request, and keyword arguments cost more to pass."""
        r = cls.__new__(cls)
        r._request_id = request_id
        r._correlation_id = correlation_id
        r._inputs = inputs
        r._requested_output_names = requested_output_names
        r._model_name = model_name
        r._model_version = model_version
        r._flags = flags
        r._timeout = timeout
        r._parameters = parameters
        r._cancelled = cancelled
        r._make_sender = make_sender
        return r

    def _response_sender(self) -> InferenceResponseSender | None:
        """The request's sender (made now if it was not yet), without marking it taken.

        A model thread and the backend may ask at once: one sender is made (the lock). The
        backend closes a sender made after its response went out by setting `_sender_closed`
        and then closing the sender it finds; made here, the sender is stored before the flag
        is read, so whichever side comes second closes it."""
        sender = self._sender
        if sender is None and self._make_sender is not None:
            with _SENDER_MAKING:
                sender = self._sender
                if sender is None:
                    sender = self._sender = self._make_sender()
                    if self._sender_closed:
                        sender._close()
        return sender

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        """Request timeout in microseconds (0: none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request parameters as a JSON object string."""
        return self._parameters

    def trace(self) -> InferenceTrace:
        if self._trace is None:
            self._trace = InferenceTrace()
        return self._trace

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def get_response_sender(self) -> InferenceResponseSender:
        sender = self._response_sender()
        if sender is None:
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to the decoupled "
                "state of the model.")
        sender._taken = True
        return sender

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def set_release_flags(self, flags: int) -> None:
        """RESCHEDULE: once execute returns, the request runs again (iterative sequences; a
        non-decoupled model returns None for it). The host does it (backend.PythonInstance)."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"invalid request release flags {flags}")
        self._release_flags = flags

    def exec(self, decoupled: bool = False) -> Any:
        """Send this request to its model and wait: the response, or with `decoupled=True` an
        iterator over every response (the last one carries the final flag)."""
        _check_serving()
        return _bls.execute(self, decoupled)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """`exec` for `async def execute`: awaitable, several may run at once (asyncio.gather)."""
        _check_serving()
        return await _bls.execute_async(self, decoupled)


def _check_serving() -> None:
    ctx = _current_context()
    if ctx is not None and not ctx.serving:
        raise TritonModelException("BLS is only supported during the 'execute' function.")


# The iterator a decoupled BLS call returns.
ResponseIterator = _bls.ResponseIterator


# --- responses -------------------------------------------------------------------------------

def _incompatible_response() -> TypeError:
    return _incompatible("__init__", "InferenceResponse(output_tensors: List[Tensor] = [], "
                         "error: TritonError = None, parameters: object = None)")


class InferenceResponse:
    """A model's response: output tensors, or an error."""

    def __init__(self, output_tensors: Any = (), error: TritonError | None = None,
                 parameters: dict | None = None) -> None:
        # As Triton's binding: not a list of tensors is a TypeError; a None tensor in the list
        # gets through it and the response refuses it.
        if not isinstance(output_tensors, (list, tuple)):
            raise _incompatible_response()
        empty = False
        for t in output_tensors:  # a loop, not all() over a generator: once per response
            if t is None:
                empty = True
            elif type(t) is not Tensor and not isinstance(t, Tensor):
                raise _incompatible_response()
        if empty:
            raise TritonModelException("Output tensor for inference response should not be empty.")
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(
                f"InferenceResponse error must be a pb_utils.TritonError, found type {type(error)}")
        self._output_tensors = list(output_tensors)
        self._err = error
        self._parameters = "{}" if parameters is None else _parameters_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._err is not None

    def error(self) -> TritonError | None:
        return self._err

    def parameters(self) -> str:
        return self._parameters


class InferenceResponseSender:
    """Sends the responses of one request (`request.get_response_sender()`).

    `emit(response, final)` is supplied by the backend; it converts and delivers the response.
    """

    def __init__(self, decoupled: bool, emit: Callable[[InferenceResponse | None, bool], None],
                 cancelled: Callable[[], bool]) -> None:
        self._decoupled = decoupled
        self._emit = emit
        self._cancelled = cancelled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0
        self._pending: InferenceResponse | None = None  # non-decoupled: held until final
        self._taken = False  # the model asked for it (request.get_response_sender())

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL and flags != 0:
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to "
                "zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"Expected an 'InferenceResponse' object, found type '{type(response)}'.")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            if not self._decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one "
                        "response.")
                if response is None and final and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final "
                        "before sending a response.")
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            self._sent += 1
            if not self._decoupled:
                # One response per request: deliver it together with the final flag.
                if not final:
                    self._pending = response
                    return
                if response is None:
                    response, self._pending = self._pending, None
            # Deliver under the lock so that the final response is always the last one.
            self._emit(response, final)

    def is_cancelled(self) -> bool:
        return self._cancelled()

    # --- used by the backend ---
    def _close(self) -> bool:
        """Close the sender; True when it had not sent its final response yet."""
        with self._lock:
            was_open = not self._closed
            self._closed = True
            return was_open

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed


# --- logging ---------------------------------------------------------------------------------

class Logger:
    """Triton's python-backend logger; writes to the `logging` logger `host.models.<model>`."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
               LogLevel.ERROR: logging.ERROR, LogLevel.VERBOSE: logging.DEBUG}

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        Logger._log(message, level)

    @staticmethod
    def log_info(message: str) -> None:
        Logger._log(message, Logger.LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger._log(message, Logger.LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger._log(message, Logger.LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger._log(message, Logger.LogLevel.VERBOSE)

    @staticmethod
    def _log(message: str, level: LogLevel) -> None:
        # Triton's binding takes a str message and a LogLevel (not a plain int): else TypeError.
        if not isinstance(message, (str, bytes)) or not isinstance(level, Logger.LogLevel):
            raise _incompatible("log", "(message: str, level: Logger.LogLevel = LogLevel.INFO)")
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        ctx = _current_context()
        logger = ctx.logger if ctx is not None else logging.getLogger("host.models")
        # stacklevel 3: the model's line, not this module's
        logger.log(Logger._LEVELS[Logger.LogLevel(level)], "%s", message, stacklevel=3)


# --- model configuration (auto-complete) -----------------------------------------------------

class ModelConfig:
    """The model configuration (Triton's JSON form) handed to `auto_complete_config`."""

    def __init__(self, model_config: str | dict) -> None:
        config = json.loads(model_config) if isinstance(model_config, (str, bytes)) else model_config
        config.setdefault("name", "")
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._model_config = config

    def as_dict(self) -> dict:
        return self._model_config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        found = None
        if "sequence_batching" in self._model_config:
            found = "sequence_batching"
        elif "ensemble_scheduling" in self._model_config:
            found = "ensemble_scheduling"
        if found is not None:
            raise ValueError(
                f"Configuration specified scheduling_choice as '{found}', but auto-complete-config "
                f"function for model '{self._name()}' tries to set scheduling_choice as "
                "'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def _add_tensor(self, kind: str, tensor: dict, valid: tuple[str, ...]) -> None:
        if not isinstance(tensor, dict):
            raise ValueError(f"{kind} in auto-complete-config function for model "
                             f"'{self._name()}' must be a dict")
        for prop in tensor:
            if prop not in valid:
                allowed = ", ".join(f"'{p}'" for p in valid[:-1]) + f" and '{valid[-1]}'"
                raise ValueError(
                    f"{kind} '{tensor.get('name', '')}' in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than {allowed}.")
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model "
                             f"'{self._name()}' is missing 'name' property.")
        for prop in ("data_type", "dims"):
            if prop not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model "
                    f"'{self._name()}' is missing '{prop}' property.")
        key = "input" if kind == "input" else "output"
        for current in self._model_config.setdefault(key, []):
            if current.get("name") != tensor["name"]:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype "
                    f"{current_type} for {kind} '{tensor['name']}', model provides "
                    f"{tensor['data_type']}")
            current_dims = current.get("dims") or []
            if current_dims and [int(d) for d in current_dims] != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{self._name()}', tensor '{tensor['name']}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{list(current_dims)}")
            if ("optional" in current and "optional" in tensor
                    and current["optional"] != tensor["optional"]):
                raise ValueError(
                    f"model '{self._name()}', tensor '{tensor['name']}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[key].append(tensor)

    def add_input(self, input: dict) -> None:  # noqa: A002 - Triton's parameter name
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        for prop in transaction_policy_dict:
            if prop != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            new = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != new:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = new


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request._inputs:
        if tensor._name == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor._name == name:
            return tensor
    return None


def _config_by_name(model_config: dict, key: str, name: str) -> dict | None:
    for props in model_config.get(key, ()) or ():
        if props.get("name") == name:
            return props
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    return _config_by_name(model_config, "input", name)


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    return _config_by_name(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


# --- model control (BLS) ---------------------------------------------------------------------

def _instance_failure(what: str, message: str) -> TritonModelException:
    """Triton's text for a model-control call the server refused."""
    ctx = _current_context()
    who = getattr(ctx, "instance_name", None) or (ctx.model_name if ctx else "")
    return TritonModelException(
        f"{what}: Failed to process the request for model '{who}', message: {message}")


def load_model(model_name: str, config: str = "", files: dict | None = None) -> None:
    """Load or reload a model (explicit model control mode); waits until it is loaded."""
    from host import bls
    from host.errors import HostError
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths and "
            "file contents")
    try:
        bls.load_model(model_name, config, files)
    except HostError as exc:
        raise _instance_failure("Failed to load model", exc.message) from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model (explicit model control mode); an unknown model is no error, as in Triton."""
    from host import bls
    from host.errors import HostError
    try:
        bls.unload_model(model_name, unload_dependents)
    except HostError as exc:
        raise _instance_failure("Failed to unload model", exc.message) from None


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    from host import bls
    from host.errors import HostError
    version = -1
    if model_version != "":
        try:
            version = int(model_version)
        except ValueError:
            raise _instance_failure("Failed to check model readiness", (
                f"failed to get model version from specified version string '{model_version}' "
                "(details: stol), version should be an integral value > 0")) from None
        if version < 0:
            raise _instance_failure("Failed to check model readiness", (
                f"failed to get model version from specified version string '{model_version}', "
                "version should be an integral value > 0"))
    try:
        return bls.model_ready(model_name, version)
    except HostError as exc:
        raise _instance_failure("Failed to check model readiness", exc.message) from None


# --- custom metrics ---------------------------------------------------------------------------
# Triton keeps custom metrics in the server's one Prometheus registry: a family is named once and
# for the server's life (a second MetricFamily of that name and kind is the same family, its
# first description kept; of another kind it is an error), and Metric objects of one family with
# the same labels share one value, exported while a Metric object refers to it. A Metric does not
# keep its MetricFamily object alive: once that is gone, the metric is cleared (Triton's stub).
# host.backends.python.custom_metrics exports them.

_METRICS_LOCK = threading.Lock()
_CLEARED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
            "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have "
            "been deleted.")


class _Family:
    """One named family of the registry; its values live while a Metric object refers to them."""

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name, self.description, self.kind = name, description, kind
        self.cells: weakref.WeakValueDictionary[tuple, _Cell] = weakref.WeakValueDictionary()


class _Cell:
    """The value Metric objects of one family and label set share."""

    def __init__(self, labels: dict, buckets: list[float] | None) -> None:
        self.labels, self.buckets = labels, buckets
        self.value = 0.0
        self.sum = 0.0
        self.counts: Any = [0] * (len(buckets) + 1) if buckets is not None else None


_FAMILIES: dict[str, _Family] = {}  # never forgotten, as Triton's registry
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")  # prometheus-cpp's checks
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def _custom_metric_families() -> list[tuple[str, str, int, list[tuple[dict, Any]]]]:
    """(name, description, kind, [(labels, (value, sum, buckets, counts))]) of every family with
    a live metric, in creation order; a histogram's counts are per bucket (not cumulative)."""
    with _METRICS_LOCK:
        out = []
        for f in _FAMILIES.values():
            cells = [(c.labels, (c.value, c.sum, c.buckets, list(c.counts) if c.counts else None))
                     for c in list(f.cells.values())]
            if cells:  # prometheus-cpp skips a family without metrics
                out.append((f.name, f.description, f.kind, cells))
        return out


class MetricFamily:
    """A custom metric family, exported on /metrics (Triton's TRITONSERVER_MetricFamilyNew)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        self._metrics: weakref.WeakSet[Metric] = weakref.WeakSet()
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TypeError(  # pybind11's words: kind is a MetricKind
                "__init__(): incompatible constructor arguments. The following argument types are "
                "supported:\n    1. c_python_backend_utils.MetricFamily(name: str, description: "
                "str, kind: c_python_backend_utils.MetricKind)\n")
        if not _METRIC_NAME.match(name) or name.startswith("__"):
            raise _instance_failure("Error when creating MetricFamily", "Invalid metric name")
        self.name, self.description, self.kind = name, description, kind
        with _METRICS_LOCK:
            family = _FAMILIES.get(name)
            if family is None:
                family = _FAMILIES[name] = _Family(name, description, kind)
            elif family.kind != kind:
                raise _instance_failure("Error when creating MetricFamily",
                                        "Family name already exists with different type")
        self._family = family

    def Metric(self, labels: dict | None = None, buckets: Any = None) -> Metric:  # noqa: N802
        # The stub's checks, then the core's (prometheus-cpp Family::Add) in Triton's words.
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self.kind != self.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            buckets = [float(b) for b in buckets]
        elif self.kind == self.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        labels = json.loads(json.dumps(labels or {}))  # as the stub sends them (keys as text)
        for label, value in labels.items():
            if not isinstance(value, str):
                raise _instance_failure("Error when creating Metric",
                                        "attempt to access JSON non-string as string")
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise _instance_failure("Error when creating Metric", "Invalid label name")
        key = tuple(sorted(labels.items()))
        with _METRICS_LOCK:
            cell = self._family.cells.get(key)
            if cell is None:  # the same labels again: the same value (prometheus Family::Add)
                if buckets is not None and any(x >= y for x, y in zip(buckets, buckets[1:])):
                    raise _instance_failure("Error when creating Metric",
                                            "Bucket Boundaries must be strictly sorted")
                cell = _Cell(labels, buckets)
                self._family.cells[key] = cell
        metric = Metric(self.kind, labels, cell)
        self._metrics.add(metric)
        return metric

    def __del__(self) -> None:
        for metric in list(getattr(self, "_metrics", ())):
            metric._cell = None  # cleared: its value goes when no other Metric refers to it


_KIND_NAMES = {MetricFamily.COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER",
               MetricFamily.GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
               MetricFamily.HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM"}


class Metric:
    def __init__(self, kind: int, labels: dict, cell: _Cell) -> None:
        self._kind, self.labels = kind, labels
        self._cell: _Cell | None = cell
        self.buckets: Any = cell.buckets  # a sorted list for a histogram, else None

    def _live(self, operation: str, supported: tuple[int, ...], verb: str) -> _Cell:
        """The metric's value cell, or Triton's error: cleared (the stub's check), then the
        core's refusal of `verb` for this kind."""
        cell = self._cell
        if cell is None:
            raise TritonModelException(f"Failed to {operation} metric value: {_CLEARED}")
        if self._kind not in supported:
            raise _instance_failure(f"Failed to {operation} metric value",
                                    f"{_KIND_NAMES[self._kind]} does not support {verb}")
        return cell

    def increment(self, value: float) -> None:
        cell = self._live("increment", (MetricFamily.COUNTER, MetricFamily.GAUGE), "Increment")
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise _instance_failure(
                "Failed to increment metric value",
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                "non-negative values.")
        with _METRICS_LOCK:
            cell.value += value

    def set(self, value: float) -> None:
        cell = self._live("set", (MetricFamily.GAUGE,), "Set")
        with _METRICS_LOCK:
            cell.value = float(value)

    def observe(self, value: float) -> None:
        cell = self._live("observe", (MetricFamily.HISTOGRAM,), "Observe")
        bounds: list[float] = cell.buckets or []
        with _METRICS_LOCK:
            cell.sum += value
            cell.value += 1
            i = next((i for i, b in enumerate(bounds) if value <= b), len(bounds))
            cell.counts[i] += 1

    def value(self) -> float:
        return self._live("get", (MetricFamily.COUNTER, MetricFamily.GAUGE), "Value").value
