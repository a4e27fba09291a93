"""PyTorch backend for modelhost (backend name "pytorch", platform "pytorch_libtorch")."""

__version__ = "0.1.0"
