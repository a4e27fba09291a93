"""The `redis` response cache for modelhost (`--cache-config redis,host=...,port=...`)."""

__version__ = "0.1.0"
