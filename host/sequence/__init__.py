"""Stateful models: the sequence batcher, its control inputs and implicit state."""

from host.sequence.batcher import SequenceBatcher

__all__ = ["SequenceBatcher"]
