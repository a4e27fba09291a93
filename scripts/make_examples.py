"""Generate the ONNX and TorchScript models of the example repository (`model_repository/`).

    python scripts/make_examples.py [--out model_repository]

No downloads: the ONNX graphs are built with the `onnx` package and the TorchScript modules are
scripted from tiny torch modules with fixed seeds, so the same command writes models with the
same graphs and weights again (TorchScript archives are not byte-for-byte reproducible). The generated files are committed (they are a few kilobytes), so a fresh clone
serves them without running this; run it again after changing a model here. The hand-written
config.pbtxt files beside them are not touched (except where a model has none on purpose).

Needs `onnx` and `torch` (both are in the test environment: `pip install onnx torch`).

The same builders make the benchmark's model (`mlp`, used by benchmarks/onnx_bench.py).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OPSET = 17
IR_VERSION = 8  # readable by every onnxruntime since 1.13


# --- ONNX --------------------------------------------------------------------------------------

def _save_onnx(graph, path: Path) -> None:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="modelhost make_examples")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def mlp_graph(inputs: int = 16, hidden: int = 64, outputs: int = 8, seed: int = 0):
    """A two-layer perceptron, batch dimension "N": OUTPUT0 = relu(INPUT0 @ W1 + b1) @ W2 + b2."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {
        "W1": rng.standard_normal((inputs, hidden)) / np.sqrt(inputs),
        "B1": rng.standard_normal(hidden) * 0.1,
        "W2": rng.standard_normal((hidden, outputs)) / np.sqrt(hidden),
        "B2": rng.standard_normal(outputs) * 0.1,
    }
    weights = {k: v.astype(np.float32) for k, v in weights.items()}
    nodes = [
        helper.make_node("MatMul", ["INPUT0", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "B1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
        helper.make_node("Add", ["h3", "B2"], ["OUTPUT0"]),
    ]
    return helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N", inputs])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N", outputs])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])


def add_sub_graph():
    """Triton's "simple" over INT32 [N, 16]: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    from onnx import TensorProto, helper

    def vi(name: str):
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["N", 16])

    return helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub", [vi("INPUT0"), vi("INPUT1")], [vi("OUTPUT0"), vi("OUTPUT1")])


def types_graph():
    """One identity-like path per datatype, no batching: strings, booleans, FP16, INT64, UINT8.

    TEXT_OUT = TEXT_IN (strings); FLAGS_OUT = not FLAGS_IN; HALF_OUT = HALF_IN * 2;
    COUNT_OUT = COUNT_IN + 1 (INT64); BYTE_OUT = BYTE_IN (UINT8, any length).
    """
    from onnx import TensorProto, helper, numpy_helper

    two = numpy_helper.from_array(np.array(2, dtype=np.float16), "two")
    one = numpy_helper.from_array(np.array(1, dtype=np.int64), "one")
    nodes = [
        helper.make_node("Identity", ["TEXT_IN"], ["TEXT_OUT"]),
        helper.make_node("Not", ["FLAGS_IN"], ["FLAGS_OUT"]),
        helper.make_node("Mul", ["HALF_IN", "two"], ["HALF_OUT"]),
        helper.make_node("Add", ["COUNT_IN", "one"], ["COUNT_OUT"]),
        helper.make_node("Identity", ["BYTE_IN"], ["BYTE_OUT"]),
    ]
    vi = helper.make_tensor_value_info
    return helper.make_graph(
        nodes, "types",
        [vi("TEXT_IN", TensorProto.STRING, [-1]), vi("FLAGS_IN", TensorProto.BOOL, [4]),
         vi("HALF_IN", TensorProto.FLOAT16, [2, 2]), vi("COUNT_IN", TensorProto.INT64, [3]),
         vi("BYTE_IN", TensorProto.UINT8, [-1])],
        [vi("TEXT_OUT", TensorProto.STRING, [-1]), vi("FLAGS_OUT", TensorProto.BOOL, [4]),
         vi("HALF_OUT", TensorProto.FLOAT16, [2, 2]), vi("COUNT_OUT", TensorProto.INT64, [3]),
         vi("BYTE_OUT", TensorProto.UINT8, [-1])],
        initializer=[two, one])


# --- TorchScript -------------------------------------------------------------------------------

def torch_classifier():
    """INPUT__0 FP32 [N, 4] -> OUTPUT__0 logits FP32 [N, 3], OUTPUT__1 class INT64 [N, 1]."""
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = self.linear(x)
            return logits, logits.argmax(dim=1, keepdim=True)

    torch.manual_seed(0)
    return torch.jit.script(Classifier().eval())


def torch_named():
    """Named inputs (forward's argument names): `scale` FP64 [2], `values` INT32 [2];
    OUTPUT__0 = values * scale (FP64)."""
    import torch

    class Scale(torch.nn.Module):
        def forward(self, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return values.to(torch.float64) * scale

    return torch.jit.script(Scale().eval())


def _save_torch(module, path: Path) -> None:
    import torch

    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())


# --- the repository ------------------------------------------------------------------------------

def build(out: Path) -> list[Path]:
    """Write every generated model under `out`; returns the files written."""
    written = []
    for name, graph in (("onnx_mlp", mlp_graph()), ("onnx_add_sub", add_sub_graph()),
                        ("onnx_types", types_graph()), ("onnx_cached", add_sub_graph())):
        path = out / name / "1" / "model.onnx"
        _save_onnx(graph, path)
        written.append(path)
    for name, module in (("torch_classifier", torch_classifier()), ("torch_named", torch_named())):
        path = out / name / "1" / "model.pt"
        _save_torch(module, path)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args()
    for path in build(args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
