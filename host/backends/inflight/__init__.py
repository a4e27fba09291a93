"""The builtin "inflight" backend: generation models served through the batch manager."""
