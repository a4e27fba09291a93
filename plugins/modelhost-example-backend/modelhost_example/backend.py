"""Backend "example": every output is its input times the model parameter `factor`.

A model config for it:

    backend: "example"
    max_batch_size: 8
    dynamic_batching { }
    input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
    parameters { key: "factor" value { string_value: "2.5" } }

The output ("OUTPUT", same type and dims as INPUT) is auto-completed when the config leaves it out.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from host.api import (Backend, InferenceRequest, InferenceResponse, Instance, InstanceSpec,
                      InvalidArgumentError, Model, ModelSpec, gather, run_batched)


class ScaleBackend(Backend):
    supported_instance_kinds = ("CPU",)

    def auto_complete_config(self, spec: ModelSpec) -> None:
        """Called before the model loads: add OUTPUT, shaped like INPUT, if the config has none."""
        config = spec.config
        if len(config.input) != 1 or config.input[0].name != "INPUT":
            raise InvalidArgumentError(f"model '{spec.name}' must have one input named INPUT")
        if not config.output:
            source = config.input[0]
            config.output.add(name="OUTPUT", data_type=source.data_type, dims=source.dims)

    def create_model(self, spec: ModelSpec) -> ScaleModel:
        return ScaleModel(spec)


class ScaleModel(Model):
    def initialize(self) -> None:
        """Called once per loaded version, before any instance: read the config."""
        text = self.spec.parameter("factor", "1")
        try:
            self.factor = float(text)
        except ValueError:
            raise InvalidArgumentError(
                f"parameter 'factor' of model '{self.spec.name}' must be a number, got '{text}'"
            ) from None
        self.batching = self.spec.config.max_batch_size > 0

    def create_instance(self, spec: InstanceSpec) -> ScaleInstance:
        return ScaleInstance(self)


class ScaleInstance(Instance):
    def __init__(self, model: ScaleModel) -> None:
        self.model = model

    def execute(self, requests: Sequence[InferenceRequest]) -> list[InferenceResponse]:
        """One response per request; a dynamic batch runs as one array operation."""
        return run_batched(requests, self.model.batching, self._run)

    def _run(self, group: Sequence[InferenceRequest]) -> dict[str, tuple[str, np.ndarray]]:
        data = gather(group)["INPUT"]
        datatype = group[0].inputs["INPUT"].datatype
        return {"OUTPUT": (datatype, (data * self.model.factor).astype(data.dtype))}
