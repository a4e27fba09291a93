"""modelhost: an inference host for Triton model repositories, in Python."""

__version__ = "0.1.0"
