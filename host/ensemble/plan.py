"""An ensemble's plan: its steps and tensors, checked against the composing models at load.

`build_plan` runs the checks Triton runs once the composing models are loaded (core's
ensemble_utils: every mapped input and output exists, each tensor has one datatype and a
compatible shape wherever it appears, a step never mixes responses of different decoupled
models) with Triton's messages, and works out whether the ensemble is decoupled. The checks on
the configuration alone (each tensor written once, every output reachable) run earlier, in
`host.config`.

A plan is read-only once built; `Plan.pruned` gives, per set of requested outputs, only the
steps those outputs need (Triton's pruning), cached per set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from host.errors import InvalidArgumentError
from host.inference import RequestedOutput
from host.proto import model_config_pb2
from host.repository import ModelKey

ModelConfig = model_config_pb2.ModelConfig
# (model name, version) -> the loaded config of that composing model (raises if not loaded).
ConfigLookup = Callable[[str, int], ModelConfig]


@dataclass(frozen=True)
class Step:
    index: int
    model_name: str
    model_version: int  # -1: the latest ready version, resolved per request
    inputs: tuple[tuple[str, str], ...]  # (model input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (model output, ensemble tensor)
    decoupled: bool
    batching: bool  # the composing model batches (max_batch_size > 0)
    input_dims: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False)

    @property
    def output_names(self) -> list[str]:
        return [m for m, _ in self.outputs]

    @property
    def requested(self) -> list[RequestedOutput]:
        """The step request's outputs: every mapped one. Shared by all its requests (read-only)."""
        found = self.__dict__.get("_requested")
        if found is None:
            found = [RequestedOutput(m) for m, _ in self.outputs]
            object.__setattr__(self, "_requested", found)
        return found


@dataclass(frozen=True)
class Pruned:
    """The part of a plan that some set of requested outputs needs."""

    steps: tuple[Step, ...]
    consumers: dict[str, tuple[Step, ...]]  # ensemble tensor -> steps that read it
    first: tuple[Step, ...]  # steps that read ensemble inputs only
    outputs: frozenset[str]  # the requested ensemble outputs
    ordered_outputs: tuple[str, ...]  # the same, in the order the configuration lists them
    readers: dict[str, int]  # ensemble tensor -> how many reads of each value (steps, response)
    # Per step index: the steps its outputs feed, each with the tensors it reads (checked when a
    # response arrives), and whether it writes a requested output.
    next_steps: dict[int, tuple[tuple[Step, tuple[str, ...]], ...]]
    writes_output: dict[int, bool]


class Plan:
    def __init__(self, config: ModelConfig, steps: list[Step], decoupled: bool) -> None:
        self.name = config.name
        self.steps = steps
        self.decoupled = decoupled
        self.batching = config.max_batch_size > 0
        self.inputs = frozenset(t.name for t in config.input)
        self.optional_inputs = frozenset(t.name for t in config.input if t.optional)
        self.outputs = frozenset(t.name for t in config.output)
        self.output_order = tuple(t.name for t in config.output)  # responses list them so
        self.output_dims = {t.name: tuple(t.reshape.shape if t.HasField("reshape") else t.dims)
                            for t in config.output}
        self.composing = sorted({(s.model_name, s.model_version) for s in steps})
        self._pruned: dict[frozenset[str], Pruned] = {}
        self._lock = threading.Lock()

    def pruned(self, requested: frozenset[str]) -> Pruned:
        """The steps needed for `requested` (empty: every output)."""
        found = self._pruned.get(requested)
        if found is None:
            with self._lock:
                found = self._pruned[requested] = self._prune(requested or self.outputs)
        return found

    def _prune(self, wanted: frozenset[str]) -> Pruned:
        needed: set[int] = set()
        producer = {t: s for s in self.steps for _, t in s.outputs}
        frontier = list(wanted)
        while frontier:  # walk back from the requested outputs to the steps that feed them
            step = producer.get(frontier.pop())
            if step is None or step.index in needed:
                continue
            needed.add(step.index)
            frontier.extend(t for _, t in step.inputs)
        steps = tuple(s for s in self.steps if s.index in needed)
        consumers: dict[str, list[Step]] = {}
        for s in steps:
            for t in {t for _, t in s.inputs}:
                consumers.setdefault(t, []).append(s)
        first = tuple(s for s in steps if all(t in self.inputs for _, t in s.inputs))
        readers: dict[str, int] = {}  # one per read: a step may map a tensor to two inputs
        for s in steps:
            for _, t in s.inputs:
                readers[t] = readers.get(t, 0) + 1
        for t in wanted:
            readers[t] = readers.get(t, 0) + 1
        next_steps, writes_output = {}, {}
        for s in steps:
            fed = {c.index: c for _, t in s.outputs for c in consumers.get(t, ())}
            next_steps[s.index] = tuple((c, tuple(t for _, t in c.inputs)) for c in fed.values())
            writes_output[s.index] = any(t in wanted for _, t in s.outputs)
        ordered = tuple(t for t in self.output_order if t in wanted)
        return Pruned(steps, {t: tuple(v) for t, v in consumers.items()}, first, wanted, ordered,
                      readers, next_steps, writes_output)


@dataclass
class _Node:
    """One ensemble tensor as the load-time check sees it (Triton's TensorNode)."""

    model: str
    datatype: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]
    label: int = -1  # decoupled lineage: 0 for ensemble inputs, a new number per decoupled step


def _node(model: str, batching: bool, datatype: int, dims: Iterable[int]) -> _Node:
    dims = tuple(dims)
    return _Node(model, datatype, dims, ((-1,) if batching else ()) + dims)


def step_model(step: model_config_pb2.ModelEnsembling.Step) -> str:
    """The model a step uses: its name, or with namespacing (set at load, host.namespacing) the
    key of the repository's model it was linked to."""
    return ModelKey(step.model_name, step.model_namespace) if step.model_namespace else step.model_name


def build_plan(config: ModelConfig, lookup: ConfigLookup) -> Plan:
    """Check the ensemble against its loaded composing models; raise InvalidArgumentError."""
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _Node] = {}
    for t in config.input:
        tensors[t.name] = _node(name, batching, t.data_type,
                                t.reshape.shape if t.HasField("reshape") else t.dims)
    for t in config.output:
        tensors[t.name] = _node(name, batching, t.data_type,
                                t.reshape.shape if t.HasField("reshape") else t.dims)
    steps: list[Step] = []
    for index, s in enumerate(config.ensemble_scheduling.step):
        model = lookup(step_model(s), s.model_version)
        if 0 < model.max_batch_size < config.max_batch_size:
            raise InvalidArgumentError(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {s.model_name} which only allows maximum batch size to be "
                f"{model.max_batch_size}")
        steps.append(_check_step(name, index, s, model, tensors))
    decoupled = _check_lineage(config, steps, tensors)
    _check_cache(config, decoupled, steps, lookup)
    return Plan(config, steps, decoupled)


def _check_step(ensemble: str, index: int, step, model: ModelConfig,
                tensors: dict[str, _Node]) -> Step:
    """Triton's ValidateTensorMapping for one step."""
    m = step_model(step)
    batching = model.max_batch_size > 0
    inputs = {i.name: i for i in model.input}
    for model_input, tensor in step.input_map.items():
        if model_input not in inputs:
            raise InvalidArgumentError(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapping to non-existing "
                f"input {model_input} in model {m}")
    for i in model.input:
        if i.name in step.input_map:
            _merge(ensemble, step.input_map[i.name], _node(m, batching, i.data_type, i.dims),
                   tensors)
        elif not i.optional:
            raise InvalidArgumentError(
                f"in ensemble {ensemble}, input {i.name} in model {m} is not mapped to any "
                "ensemble tensors")
    outputs = {o.name: o for o in model.output}
    for model_output, tensor in step.output_map.items():
        o = outputs.get(model_output)
        if o is None:
            raise InvalidArgumentError(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapped from non-existing "
                f"output {model_output} in model {m}")
        _merge(ensemble, tensor, _node(m, batching, o.data_type, o.dims), tensors)
    return Step(index=index, model_name=m, model_version=step.model_version,
                inputs=tuple(sorted(step.input_map.items())),
                outputs=tuple(sorted(step.output_map.items())),
                decoupled=model.model_transaction_policy.decoupled, batching=batching,
                input_dims={i.name: tuple(i.dims) for i in model.input})


def _merge(ensemble: str, tensor: str, node: _Node, tensors: dict[str, _Node]) -> None:
    """Record where `tensor` appears; a second appearance must agree (Triton's consistency)."""
    seen = tensors.get(tensor)
    if seen is None:
        tensors[tensor] = node
        return
    prefix = f"in ensemble {ensemble}, ensemble tensor {tensor}: "
    if seen.datatype != node.datatype:
        raise InvalidArgumentError(
            f"{prefix}inconsistent data type: {_type(seen.datatype)} is inferred from model "
            f"{seen.model} while {_type(node.datatype)} is inferred from model {node.model}")
    if not (_dims_match(seen.dims, node.dims) or _dims_match(seen.full_dims, node.full_dims)):
        raise InvalidArgumentError(
            f"{prefix}inconsistent shape: {_dims(seen.full_dims)} is inferred from model "
            f"{seen.model} while {_dims(node.full_dims)} is inferred from model {node.model}")


def _check_lineage(config: ModelConfig, steps: list[Step], tensors: dict[str, _Node]) -> bool:
    """Give every tensor its decoupled lineage; a step may not read tensors of two lineages
    (their responses could not be paired). Returns whether any needed step is decoupled."""
    for t in config.input:
        tensors[t.name].label = 0
    labels = 0
    pending = list(steps)
    while pending:
        ready = [s for s in pending if all(tensors[t].label >= 0 for _, t in s.inputs)]
        if not ready:
            break  # the rest is unreachable: host.config reports that
        for s in ready:
            found = {tensors[t].label for _, t in s.inputs}
            if len(found) > 1:
                raise InvalidArgumentError(
                    f"in ensemble {config.name}, step of model '{s.model_name}' receives inputs "
                    "originated from different decoupled models")
            label = found.pop()
            if s.decoupled:
                labels += 1
                label = labels
            for _, t in s.outputs:
                tensors[t].label = label
            pending.remove(s)
    # The ensemble's outputs are read together too, as by a last step named after it.
    found = {tensors[o.name].label if o.name in tensors else -1 for o in config.output}
    if len(found) > 1 and -1 not in found:
        raise InvalidArgumentError(
            f"in ensemble {config.name}, step of model '{config.name}' receives inputs "
            "originated from different decoupled models")
    return labels > 0


def _check_cache(config: ModelConfig, decoupled: bool, steps: list[Step],
                 lookup: ConfigLookup) -> None:
    """The ensemble's own response cache needs every composing model to support caching."""
    if not config.response_cache.enable:
        return
    if decoupled:
        raise InvalidArgumentError(
            f"Response Cache does not currently support model {config.name} with 'decoupled' "
            "transaction policy. Please disable the response cache.")
    for s in steps:
        model = lookup(s.model_name, s.model_version)
        if model.HasField("sequence_batching"):
            raise InvalidArgumentError(
                f"Response Cache does not currently support ensemble {config.name}: its "
                f"composing model {s.model_name} uses the sequence batching scheduler. Please "
                "disable the response cache.")


def _dims_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _dims(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _type(datatype: int) -> str:
    return model_config_pb2.DataType.Name(datatype)
