"""The sequence batcher's control inputs (START, END, READY, CORRID) and correlation-id rules.

Built once per loaded model from `sequence_batching.control_input`. For each request the batcher
adds one tensor per configured control to the request's inputs, as Triton's sequence batcher
does with its override inputs: shape [1] (with the batch dimension, [1, 1], for a model that
batches), START/END/READY holding the configured false or true value, CORRID the correlation id
in the configured datatype. A padding request (a batch slot without a request, in the direct
strategy) carries every control as false and CORRID 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from host import datatypes
from host.errors import InvalidArgumentError
from host.inference import InferenceRequest, Tensor
from host.proto.model_config_pb2 import ModelConfig, ModelSequenceBatching

_Control = ModelSequenceBatching.Control
# The config's false/true field -> the control tensor's datatype.
_FALSE_TRUE = (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"),
               ("bool_false_true", "BOOL"))
_NUMERIC_CORRID = frozenset({"UINT64", "INT64", "UINT32", "INT32"})


@dataclass(frozen=True)
class _Flag:
    """A START, END or READY control: its tensor name and its false/true tensors."""

    name: str
    off: Tensor
    on: Tensor


def request_log_prefix(request: InferenceRequest) -> str:
    """Triton's `LogRequest()`: the prefix of the errors its core raises for a request."""
    return f"[request id: {request.id or '<id_unknown>'}] "


def in_sequence(sequence_id: int | str) -> bool:
    """0 and "" mean "no correlation id", as in Triton."""
    return sequence_id != 0 and sequence_id != ""


class Controls:
    def __init__(self, config: ModelConfig) -> None:
        self.model = config.name
        self.batching = config.max_batch_size > 0
        self.shape = [1, 1] if self.batching else [1]
        self.start = self.end = self.ready = None
        self.corrid_name = ""
        self.corrid_type = ""
        for control_input in config.sequence_batching.control_input:
            for control in control_input.control:
                if control.kind == _Control.CONTROL_SEQUENCE_CORRID:
                    self.corrid_name = control_input.name
                    self.corrid_type = datatypes.from_config_enum(control.data_type)
                    continue
                flag = self._flag(control_input.name, control)
                if control.kind == _Control.CONTROL_SEQUENCE_START:
                    self.start = flag
                elif control.kind == _Control.CONTROL_SEQUENCE_END:
                    self.end = flag
                elif control.kind == _Control.CONTROL_SEQUENCE_READY:
                    self.ready = flag
        self._padding_corrid = self.corrid_tensor("" if self.corrid_type == "BYTES" else 0)
        # The inputs the controls fill in (a padding row takes them from here, not from zeros).
        self.names = frozenset([f.name for f in (self.start, self.end, self.ready) if f is not None]
                               + ([self.corrid_name] if self.corrid_name else []))

    def _flag(self, name: str, control: ModelSequenceBatching.Control) -> _Flag:
        for field, datatype in _FALSE_TRUE:
            values = list(getattr(control, field))
            if values:
                dtype = datatypes.to_numpy(datatype)
                false, true = (np.array(v, dtype=dtype).reshape(self.shape) for v in values)
                for array in (false, true):
                    array.flags.writeable = False  # shared by every request
                return _Flag(name, Tensor(name, datatype, list(self.shape), false),
                             Tensor(name, datatype, list(self.shape), true))
        raise InvalidArgumentError(f"control '{name}' has no false/true values")  # config checked it

    # --- request checks ---------------------------------------------------------------------
    def check_id_type(self, request: InferenceRequest) -> None:
        """Triton's ValidateCorrelationId: the id's type must suit the CORRID control."""
        if not self.corrid_name:
            return
        given = "BYTES" if isinstance(request.sequence_id, str) else "UINT64"
        fits = (self.corrid_type == "BYTES") if given == "BYTES" else \
            (self.corrid_type in _NUMERIC_CORRID)
        if not fits:
            raise InvalidArgumentError(
                f"{request_log_prefix(request)}sequence batching control '{self.corrid_name}' "
                f"data-type is '{given}', but model '{self.model}' expects '{self.corrid_type}'")

    # --- the tensors ------------------------------------------------------------------------
    def add_to(self, request: InferenceRequest, corrid: Tensor | None) -> None:
        """Put the control tensors of a real request into its inputs (`corrid`: `corrid_tensor`
        of its sequence, made once per sequence). The tensors are shared: read-only."""
        inputs = request.inputs
        for flag, on in ((self.start, request.sequence_start), (self.end, request.sequence_end),
                         (self.ready, True)):
            if flag is not None:
                inputs[flag.name] = flag.on if on else flag.off
        if corrid is not None:
            inputs[self.corrid_name] = corrid

    def add_padding_inputs(self, inputs: dict[str, Tensor]) -> None:
        """A batch slot without a request: every control false ("not ready"), CORRID 0."""
        for flag in (self.start, self.end, self.ready):
            if flag is not None:
                inputs[flag.name] = flag.off
        if self._padding_corrid is not None:
            inputs[self.corrid_name] = self._padding_corrid

    def corrid_tensor(self, sequence_id: int | str) -> Tensor | None:
        return self._corrid(sequence_id) if self.corrid_name else None

    def _corrid(self, sequence_id: int | str) -> Tensor:
        if self.corrid_type == "BYTES":
            data = np.array([str(sequence_id).encode()], dtype=object).reshape(self.shape)
        else:
            # Triton copies the id's low bytes into the tensor: UINT32/INT32 keep its low 32 bits,
            # the signed types read them as two's complement.
            raw = np.array([int(sequence_id) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
            data = raw.view(np.uint32)[:1] if self.corrid_type in ("UINT32", "INT32") else raw
            data = data.view(datatypes.to_numpy(self.corrid_type)).reshape(self.shape)
        return Tensor(self.corrid_name, self.corrid_type, list(self.shape), data)

