"""Builtin backend plugins."""
