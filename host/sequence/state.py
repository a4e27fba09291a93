"""Implicit state (`sequence_batching { state [...] }`): kept by the host between the requests
of a sequence, as Triton's SequenceStates.

- `StateSpecs` is built once per loaded model: each state's input and output names, datatype,
  dims, and its initial value (`initial_state`: zeros, or the raw row-major contents of
  `<model dir>/initial_state/<data_file>`), with Triton's load-time checks and messages.
- `SequenceStates` belongs to one sequence. Before each execute the batcher adds the current
  value of every state to the request's inputs, under the state's `input_name`; a model then
  produces the next value under the state's `output_name`: python models as an output tensor of
  that name (kept by the host, and sent to the client only when the config lists it among the
  outputs), native backends with TRITONBACKEND_StateNew / StateBuffer / StateUpdate. A request
  with the START flag begins again from the initial value.
- Without `initial_state` the first value is zeros (Triton leaves it uninitialized), with every
  variable dimension taken as 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from host import datatypes
from host.errors import InvalidArgumentError
from host.inference import Tensor
from host.proto.model_config_pb2 import ModelConfig

INITIAL_STATE_FOLDER = "initial_state"


@dataclass(frozen=True)
class StateSpec:
    input_name: str
    output_name: str
    datatype: str
    initial: np.ndarray  # read-only; copied into each sequence at its start
    # use_same_buffer_for_input_output: a native backend writes the next value in place, into
    # the memory the request's input state lies in (SequenceStates.shared_buffer)
    single_buffer: bool = False


class StateSpecs:
    def __init__(self, config: ModelConfig, model_dir: Path | None) -> None:
        self.specs: list[StateSpec] = []
        batch = [1] if config.max_batch_size > 0 else []
        seen: set[str] = set()
        for state in config.sequence_batching.state:
            datatype = datatypes.from_config_enum(state.data_type)
            if len(state.initial_state) > 1:
                raise InvalidArgumentError(
                    f"initial_state field for state input '{state.input_name}' must contain "
                    f"exactly one or zero element. Found '{len(state.initial_state)}' elements.")
            if state.input_name in seen:
                raise InvalidArgumentError(
                    f"State input name '{state.input_name}' specified more than once.")
            seen.add(state.input_name)
            if state.initial_state:
                initial = _initial_value(state, datatype, batch, model_dir)
            else:
                shape = batch + [1 if d == -1 else d for d in state.dims]
                initial = _zeros(datatype, shape)
            initial.flags.writeable = False
            self.specs.append(StateSpec(state.input_name, state.output_name, datatype, initial,
                                        state.use_same_buffer_for_input_output and datatype != "BYTES"))
        self.output_names = frozenset(s.output_name for s in self.specs)

    def __bool__(self) -> bool:
        return bool(self.specs)

    def new(self) -> SequenceStates:
        return SequenceStates(self)


def _zeros(datatype: str, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=datatypes.to_numpy(datatype))


def _initial_value(state, datatype: str, batch: list[int], model_dir: Path | None) -> np.ndarray:
    """Triton's GenerateInitialStateData: checks, then zeros or the data file's bytes."""
    init, name = state.initial_state[0], state.input_name
    if init.data_type != state.data_type:
        raise InvalidArgumentError(
            f"The data type used for 'initial_state' field of state '{name}' does not match the "
            "state data type.")
    if not init.name:
        raise InvalidArgumentError(
            f"Field 'name' must be set when using initial_state for state input '{name}'.")
    if len(init.dims) != len(state.dims):
        raise InvalidArgumentError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(init.dims)} != {len(state.dims)}")
    for dim, want in zip(init.dims, state.dims):
        if dim == -1:
            raise InvalidArgumentError(
                f"'initial_state' field for state input name '{name}' contains variable "
                "dimensions.")
        if want != -1 and dim != want:
            raise InvalidArgumentError(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {dim} != {want}")
    shape = batch + list(init.dims)
    which = init.WhichOneof("state_data")
    if which == "zero_data":
        return _zeros(datatype, shape)
    if which != "data_file":
        raise InvalidArgumentError(
            f"initial_state setting expects state'{name}' to have state_data set")
    path = Path(model_dir or ".") / INITIAL_STATE_FOLDER / init.data_file
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"failed to read initial state file '{path}': {exc}") from None
    if datatype == "BYTES":
        return _bytes_state(raw, shape)
    count = int(np.prod(shape)) if shape else 1
    size = count * datatypes.element_size(datatype)
    if size > len(raw):
        raise InvalidArgumentError(
            f"initial_state setting expects {size} bytes, but the data provided from "
            f"{init.data_file}only has {len(raw)} bytes.")  # (Triton's text, missing space included)
    return np.frombuffer(raw[:size], dtype=datatypes.to_numpy(datatype)).reshape(shape).copy()


def _bytes_state(raw: bytes, shape: list[int]) -> np.ndarray:
    """A TYPE_STRING state's initial value from its file. Triton copies the file as it is,
    whatever its size (no check for STRING, the model loads), and leaves its bytes to the
    backend; here the elements are the file's length-prefixed strings, read as far as they go:
    an element cut short keeps the bytes that are there, missing ones are empty."""
    count = int(np.prod(shape)) if shape else 1
    items: list[bytes] = []
    offset = 0
    while len(items) < count and offset + 4 <= len(raw):
        length = int.from_bytes(raw[offset:offset + 4], "little")
        items.append(raw[offset + 4:offset + 4 + length])
        offset += 4 + length
    items.extend(b"" for _ in range(count - len(items)))
    return datatypes.bytes_array(items, shape)


class SequenceStates:
    """The current value of every state of one sequence (owned by its batch slot)."""

    def __init__(self, specs: StateSpecs) -> None:
        self.specs = specs
        self.by_output = {s.output_name: s for s in specs.specs}
        self.values: dict[str, Tensor] = {}
        self.reset()

    def reset(self) -> None:
        # A single-buffer state gets memory of its own, which the backend may write.
        self.values = {s.input_name: Tensor(s.input_name, s.datatype, list(s.initial.shape),
                                            s.initial.copy() if s.single_buffer else s.initial)
                       for s in self.specs.specs}

    def add_to(self, inputs: dict[str, Tensor]) -> None:
        inputs.update(self.values)

    def update(self, output_name: str, tensor: Tensor) -> None:
        """The model produced the next value of the state called `output_name`."""
        spec = self.by_output.get(output_name)
        if spec is None:
            raise InvalidArgumentError(f"state '{output_name}' is not a valid state name.")
        self.values[spec.input_name] = Tensor(spec.input_name, tensor.datatype,
                                              list(tensor.shape), tensor.data)

    def shared_buffer(self, output_name: str, datatype: str, shape: tuple[int, ...],
                      byte_size: int) -> np.ndarray | None:
        """TRITONBACKEND_StateBuffer of a single-buffer state (None for any other): the memory the
        backend writes the next value into, which is from now on the input state too. It is the
        current input state's own memory when that has the size asked for (as Triton reuses it),
        else new memory of that size."""
        spec = self.by_output.get(output_name)
        if spec is None or not spec.single_buffer or datatype == "BYTES":
            return None
        current = self.values[spec.input_name].data
        if (isinstance(current, np.ndarray) and current.nbytes == byte_size
                and current.flags.writeable and current.flags.c_contiguous):
            memory = current.reshape(-1).view(np.uint8)
        else:
            memory = np.zeros(byte_size, np.uint8)
        dtype = datatypes.to_numpy(datatype)
        count = int(np.prod(shape)) if shape else 1
        if count * dtype.itemsize == byte_size:
            self.values[spec.input_name] = Tensor(spec.input_name, datatype, list(shape),
                                                  memory.view(dtype).reshape(shape))
        return memory

    def update_from_native(self, output_name: str, datatype: str, shape: tuple[int, ...],
                           buffer: bytes) -> None:
        """TRITONBACKEND_StateUpdate: the bytes a native backend wrote into its state buffer."""
        data = datatypes.array_from_buffer(datatype, list(shape), memoryview(buffer))
        self.update(output_name, Tensor(output_name, datatype, list(shape), data))
