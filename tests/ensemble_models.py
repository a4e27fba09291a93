"""Small python models and ensembles for the ensemble tests, written into a tmp repository."""

from __future__ import annotations

import textwrap
from pathlib import Path

_HEAD = "import json, threading, time, builtins\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n"


def _io(inputs: list[tuple[str, str, str]], outputs: list[tuple[str, str, str]]) -> str:
    def block(items: list[tuple[str, str, str]]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_{t} dims: [ {d} ] }}' for n, t, d in items)
    return f"input [ {block(inputs)} ]\noutput [ {block(outputs)} ]\n"


def python_model(root: Path, name: str, body: str, io: str, extra: str = "",
                 versions: dict[int, str] | None = None) -> None:
    """A python model: `body` is the class body of TritonPythonModel."""
    folder = root / name
    for version, text in (versions or {1: body}).items():
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        source = _HEAD + "\n\nclass TritonPythonModel:\n" + textwrap.indent(textwrap.dedent(text), "    ")
        (folder / str(version) / "model.py").write_text(source)
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\n{io}{extra}instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n')


def ensemble(root: Path, name: str, io: str, steps: list[tuple], extra: str = "") -> None:
    """steps: (model, {model input: tensor}, {model output: tensor}[, version])."""
    rendered = []
    for step in steps:
        model, inputs, outputs = step[:3]
        version = step[3] if len(step) > 3 else -1
        maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
        maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
        rendered.append(f'{{ model_name: "{model}" model_version: {version}{maps} }}')
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(
        f'platform: "ensemble"\n{io}{extra}ensemble_scheduling {{ step [ {", ".join(rendered)} ] }}\n')


# --- model bodies -----------------------------------------------------------------------------

def unary(expr: str, inputs: tuple[str, ...] = ("INPUT0",), output: str = "OUTPUT0",
          before: str = "") -> str:
    """execute: OUTPUT = expr over the named inputs (numpy arrays)."""
    get = "".join(f'        {n} = pb_utils.get_input_tensor_by_name(r, "{n}").as_numpy()\n' for n in inputs)
    return (f"def execute(self, requests):\n    out = []\n    for r in requests:\n{get}"
            f"{textwrap.indent(before, '        ')}"
            f'        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("{output}", np.asarray({expr}))]))\n'
            "    return out\n")


REPEAT = """
def execute(self, requests):
    for r in requests:
        x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
        sender = r.get_response_sender()
        for v in x.reshape(-1):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], x.dtype))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Triton's square example: IN [1] -> IN responses, each IN*IN.
SQUARE = """
def execute(self, requests):
    for r in requests:
        x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
        sender = r.get_response_sender()
        for _ in range(int(x[0])):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * x)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Both branch models wait for each other: a run that is not concurrent breaks the barrier.
BARRIER = """
def initialize(self, args):
    self.barrier = builtins.__dict__.setdefault("_ensemble_test_barrier", threading.Barrier(2, timeout=20))

def execute(self, requests):
    out = []
    for r in requests:
        x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("branches did not run concurrently")))
            continue
        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
    return out
"""

ECHO_REQUEST = """
def execute(self, requests):
    out = []
    for r in requests:
        x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
        info = json.dumps({"parameters": json.loads(r.parameters()), "timeout": r.timeout(),
                           "id": r.request_id()})
        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x),
                                               pb_utils.Tensor("INFO", np.array([info.encode()], dtype=object))]))
    return out
"""

# Runs until its request is cancelled, then answers with an error (counted as a failure).
UNTIL_CANCELLED = """
def execute(self, requests):
    out = []
    for r in requests:
        deadline = time.monotonic() + 30
        while not r.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
        out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("saw the cancellation"))
                   if r.is_cancelled() else pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
    return out
"""

FAIL = """
def execute(self, requests):
    return [pb_utils.InferenceResponse(error=pb_utils.TritonError("boom from the fail model"))
            for _ in requests]
"""

# BLS: calls the ens_chain ensemble and answers with its output.
BLS_TO_ENSEMBLE = """
def execute(self, requests):
    out = []
    for r in requests:
        x = pb_utils.get_input_tensor_by_name(r, "INPUT0")
        reply = pb_utils.InferenceRequest(model_name="ens_chain", inputs=[x],
                                          requested_output_names=["OUTPUT0"]).exec()
        if reply.has_error():
            out.append(pb_utils.InferenceResponse(error=reply.error()))
        else:
            y = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
    return out
"""

F = ("INPUT0", "FP32", "-1")
O = ("OUTPUT0", "FP32", "-1")
IO = _io([F], [O])
INT_IO = _io([("IN", "INT32", "-1")], [("OUT", "INT32", "-1")])
INT1_IO = _io([("IN", "INT32", "1")], [("OUT", "INT32", "1")])
DECOUPLED = "model_transaction_policy { decoupled: true }\n"
CACHE = "response_cache { enable: true }\n"
CHAIN = [("ident", {"INPUT0": "INPUT0"}, {"OUTPUT0": "t1"}),
         ("add1", {"INPUT0": "t1"}, {"OUTPUT0": "OUTPUT0"})]


def write_repository(root: Path) -> Path:
    """The models the ensemble tests serve; those named in GOOD load at start."""
    root.mkdir(parents=True, exist_ok=True)
    python_model(root, "ident", unary("INPUT0"), IO)
    python_model(root, "add1", unary("INPUT0 + 1"), IO)
    python_model(root, "mul2", unary("INPUT0 * 2"), IO)
    python_model(root, "ident_cached", unary("INPUT0"), IO, CACHE)
    python_model(root, "versioned", "", IO + "version_policy { all { } }\n",
                 versions={1: unary("INPUT0 + 10"), 2: unary("INPUT0 + 20")})
    python_model(root, "fail", FAIL, IO)
    python_model(root, "bls_to_ensemble", BLS_TO_ENSEMBLE, IO)
    python_model(root, "barrier_a", BARRIER, IO)
    python_model(root, "barrier_b", BARRIER, IO)
    python_model(root, "sum2", unary("A + B", ("A", "B")),
                 _io([("A", "FP32", "-1"), ("B", "FP32", "-1")], [O]))
    python_model(root, "echo_request", ECHO_REQUEST, _io([F], [O, ("INFO", "STRING", "1")]))
    python_model(root, "until_cancelled", UNTIL_CANCELLED, IO)
    python_model(root, "repeat", REPEAT, INT_IO, DECOUPLED)
    python_model(root, "square", SQUARE, INT1_IO, DECOUPLED)
    python_model(root, "plus1_int", unary("IN + 1", ("IN",), "OUT"), INT1_IO)
    python_model(root, "times2_int", unary("IN * 2", ("IN",), "OUT"), INT1_IO)
    python_model(root, "sum2_int", unary("A + B", ("A", "B"), "OUT"),
                 _io([("A", "INT32", "1"), ("B", "INT32", "1")], [("OUT", "INT32", "1")]))

    ensemble(root, "ens_chain", IO, CHAIN)
    ensemble(root, "ens_cached", IO, CHAIN, CACHE)
    ensemble(root, "ens_composing_cached", IO,
             [("ident_cached", {"INPUT0": "INPUT0"}, {"OUTPUT0": "t1"}),
              ("add1", {"INPUT0": "t1"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "ens_latest", IO, [("versioned", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "ens_v1", IO, [("versioned", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}, 1)])
    ensemble(root, "ens_fail", IO, [("ident", {"INPUT0": "INPUT0"}, {"OUTPUT0": "t1"}),
                                    ("fail", {"INPUT0": "t1"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "ens_branches", IO,
             [("barrier_a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "a"}),
              ("barrier_b", {"INPUT0": "INPUT0"}, {"OUTPUT0": "b"}),
              ("sum2", {"A": "a", "B": "b"}, {"OUTPUT0": "OUTPUT0"})])
    # Two outputs, each from its own branch: asking for one skips the other branch.
    ensemble(root, "ens_two_outputs", _io([F], [("PLUS", "FP32", "-1"), ("TIMES", "FP32", "-1")]),
             [("add1", {"INPUT0": "INPUT0"}, {"OUTPUT0": "PLUS"}),
              ("mul2", {"INPUT0": "INPUT0"}, {"OUTPUT0": "TIMES"})])
    ensemble(root, "ens_echo", _io([F], [O, ("INFO", "STRING", "1")]),
             [("echo_request", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0", "INFO": "INFO"})])
    ensemble(root, "ens_cancel", IO, [("ident", {"INPUT0": "INPUT0"}, {"OUTPUT0": "t1"}),
                                      ("until_cancelled", {"INPUT0": "t1"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "ens_nested", IO, [("ens_chain", {"INPUT0": "INPUT0"}, {"OUTPUT0": "t1"}),
                                      ("mul2", {"INPUT0": "t1"}, {"OUTPUT0": "OUTPUT0"})])
    # Decoupled: repeat -> square (Triton's examples), and fan-out then fan-in per response.
    ensemble(root, "ens_repeat_square", INT_IO,
             [("repeat", {"IN": "IN"}, {"OUT": "each"}),
              ("square", {"IN": "each"}, {"OUT": "OUT"})])
    ensemble(root, "ens_fan", INT_IO,
             [("repeat", {"IN": "IN"}, {"OUT": "each"}),
              ("plus1_int", {"IN": "each"}, {"OUT": "p"}),
              ("times2_int", {"IN": "each"}, {"OUT": "t"}),
              ("sum2_int", {"A": "p", "B": "t"}, {"OUT": "OUT"})])
    ensemble(root, "ens_nested_decoupled", INT_IO,
             [("ens_repeat_square", {"IN": "IN"}, {"OUT": "sq"}),
              ("plus1_int", {"IN": "sq"}, {"OUT": "OUT"})])
    return root


GOOD = ["bls_to_ensemble", "ens_chain", "ens_cached", "ens_composing_cached", "ens_latest", "ens_v1", "ens_fail",
        "ens_branches", "ens_two_outputs", "ens_echo", "ens_cancel", "ens_nested",
        "ens_repeat_square", "ens_fan", "ens_nested_decoupled"]


def write_broken(root: Path) -> dict[str, str]:
    """Ensembles that must fail to load, by name, with the text their error must contain."""
    two = _io([F], [O, ("OUTPUT1", "FP32", "-1")])
    ensemble(root, "bad_unknown", IO, [("no_such_model", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "bad_input_map", IO, [("ident", {"NOPE": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "bad_output_map", IO, [("ident", {"INPUT0": "INPUT0"}, {"NOPE": "OUTPUT0"})])
    ensemble(root, "bad_datatype", _io([("INPUT0", "INT32", "-1")], [O]),
             [("ident", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "bad_shape", _io([("INPUT0", "FP32", "4, 4")], [O]),
             [("ident", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "bad_between_steps", IO,
             [("ident", {"INPUT0": "INPUT0"}, {"OUTPUT0": "t1"}),
              ("plus1_int", {"IN": "t1"}, {"OUT": "OUTPUT0"})])
    ensemble(root, "bad_cycle_a", IO, [("bad_cycle_b", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "bad_cycle_b", IO, [("bad_cycle_a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})])
    ensemble(root, "bad_unwritten", two, [("ident", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}),
                                          ("add1", {"INPUT0": "never"}, {"OUTPUT0": "OUTPUT1"})])
    ensemble(root, "bad_cache_decoupled", INT_IO, [("repeat", {"IN": "IN"}, {"OUT": "OUT"})], CACHE)
    python_model(root, "sequence_ident", unary("INPUT0"), IO, "sequence_batching { }\n")
    ensemble(root, "bad_cache_sequence", IO,
             [("sequence_ident", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})], CACHE)
    ensemble(root, "bad_two_lineages", INT_IO,
             [("repeat", {"IN": "IN"}, {"OUT": "a"}),
              ("repeat", {"IN": "IN"}, {"OUT": "b"}),
              ("sum2_int", {"A": "a", "B": "b"}, {"OUT": "OUT"})])
    # two decoupled steps, each writing an output of the ensemble: read together, by no step
    ensemble(root, "bad_two_lineage_outputs",
             _io([("IN", "INT32", "-1")], [("OUT", "INT32", "-1"), ("OUT2", "INT32", "-1")]),
             [("repeat", {"IN": "IN"}, {"OUT": "OUT"}), ("repeat", {"IN": "IN"}, {"OUT": "OUT2"})])
    return {
        "bad_unknown": "ensemble bad_unknown contains models that are not available or ambiguous: no_such_model",
        "bad_input_map": "in ensemble bad_input_map, ensemble tensor INPUT0 is mapping to non-existing input NOPE in model ident",
        "bad_output_map": "in ensemble bad_output_map, ensemble tensor OUTPUT0 is mapped from non-existing output NOPE in model ident",
        "bad_datatype": "in ensemble bad_datatype, ensemble tensor INPUT0: inconsistent data type: TYPE_INT32 is inferred from model bad_datatype while TYPE_FP32 is inferred from model ident",
        "bad_shape": "in ensemble bad_shape, ensemble tensor INPUT0: inconsistent shape: [4,4] is inferred from model bad_shape while [-1] is inferred from model ident",
        "bad_between_steps": "in ensemble bad_between_steps, ensemble tensor t1: inconsistent data type: TYPE_FP32 is inferred from model ident while TYPE_INT32 is inferred from model plus1_int",
        "bad_cycle_a": "circular dependency between ensembles: bad_cycle_a -> ... -> bad_cycle_b -> bad_cycle_a",
        "bad_unwritten": "output 'OUTPUT1' for ensemble 'bad_unwritten' is not written",
        "bad_cache_decoupled": "Response Cache does not currently support model bad_cache_decoupled with 'decoupled' transaction policy. Please disable the response cache.",
        "bad_cache_sequence": "Response Cache does not currently support ensemble bad_cache_sequence: its composing model sequence_ident uses the sequence batching scheduler",
        "bad_two_lineages": "in ensemble bad_two_lineages, step of model 'sum2_int' receives inputs originated from different decoupled models",
        "bad_two_lineage_outputs": "in ensemble bad_two_lineage_outputs, step of model 'bad_two_lineage_outputs' receives inputs originated from different decoupled models",
    }
