"""ONNX Runtime backend for modelhost (backend name "onnxruntime", platform "onnxruntime_onnx")."""

__version__ = "0.1.0"
