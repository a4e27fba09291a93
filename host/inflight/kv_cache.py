"""A paged KV cache: fixed-size blocks from one preallocated pool, per-request block tables.

The pool is two torch tensors (keys, values) of shape
`[layers, num_blocks * tokens_per_block, heads, head_dim]`: token slot `b * tokens_per_block + i`
is offset `i` of block `b`. A request owns a list of block ids (its block table); the model writes
the keys and values of new tokens into their slots and gathers a request's own slots to attend.
Nothing is copied when the batch changes: a request that leaves just gives its blocks back.

Block reuse (`enable_block_reuse`): a block that is full is registered under a hash of its tokens
and of every token before it (the hash of the previous block chains in), so equal prefixes give
equal hashes. A new request whose prompt starts with registered blocks takes them (reference
counted) instead of computing them again. A hash is only a lookup key: a match is accepted when
the block's own tokens are equal and its predecessor is the very registration the request
matched just before (each registration has a serial number; a block evicted and registered
again gets a new one), so a hash collision can never hand out someone else's keys and values.
Blocks are registered when the iteration that fills them is scheduled (their keys and values are
written by that iteration's forward pass, before any attention reads them), so requests with a
common prefix admitted in the same iteration share its blocks too. A registered block nobody references any more stays
registered but evictable (least recently released first): it counts as free, and allocation takes
it only when no never-registered block is left.

Accounting: `num_free` counts unreferenced blocks (evictable ones included), `num_used` the
referenced ones; `num_used + num_free == num_blocks` always.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class KVCacheConfig:
    """How big the pool is (as the seed's kvCacheConfig).

    The pool holds `min(max_tokens, free_memory_fraction * free memory)` tokens, rounded down to
    whole blocks; whichever is None does not limit. With both None the fraction default applies.
    `max_useful_tokens` (set by the manager: max batch size x max sequence length) caps it too:
    blocks beyond what the batch can ever hold would only be reuse cache.
    """

    max_tokens: int | None = None
    free_memory_fraction: float | None = 0.9
    tokens_per_block: int = 16
    enable_block_reuse: bool = False


def free_memory_bytes(device: torch.device) -> int:
    """Free memory of the device the pool lives on (CUDA: the driver's figure; CPU: MemAvailable)."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def pool_blocks(config: KVCacheConfig, bytes_per_token: int, free_bytes: int,
                max_useful_tokens: int | None = None) -> int:
    """Number of blocks the pool gets under `config`."""
    limits = []
    if config.max_tokens is not None:
        limits.append(config.max_tokens)
    if config.free_memory_fraction is not None:
        limits.append(int(free_bytes * config.free_memory_fraction) // bytes_per_token)
    if max_useful_tokens is not None:
        limits.append(max_useful_tokens)
    tokens = min(limits) if limits else 0
    blocks = tokens // config.tokens_per_block
    if blocks < 1:
        raise ValueError(f"the KV cache holds no block: {tokens} tokens for blocks of "
                         f"{config.tokens_per_block} (kv cache config {config})")
    return blocks


class OutOfBlocks(Exception):
    """Not enough free blocks for an allocation (the scheduler checks first; this is a guard)."""


class KVCache:
    """The block pool, its tensors and its bookkeeping. Used by the manager's worker thread only."""

    def __init__(self, *, layers: int, heads: int, head_dim: int, num_blocks: int,
                 tokens_per_block: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                 enable_block_reuse: bool = False) -> None:
        import torch

        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.enable_block_reuse = enable_block_reuse
        shape = (layers, num_blocks * tokens_per_block, heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self._ref = [0] * num_blocks
        self._free: collections.deque[int] = collections.deque(range(num_blocks))
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._hash_of: dict[int, int] = {}
        self._block_of: dict[int, int] = {}
        # block -> (its serial, the serial of the block before it (0: none), its tokens)
        self._content: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        self._serial = 0
        self.reused_blocks = 0  # blocks handed out from the reuse cache, cumulative

    # --- accounting ----------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.tokens_per_block)

    # --- allocation ----------------------------------------------------------------------------
    def allocate(self, count: int) -> list[int]:
        if count > self.num_free:
            raise OutOfBlocks(f"{count} blocks asked, {self.num_free} free")
        blocks = []
        for _ in range(count):
            if self._free:
                block = self._free.popleft()
            else:  # evict the least recently released registered block
                block, _ = self._evictable.popitem(last=False)
                self._unregister(block)
            self._ref[block] = 1
            blocks.append(block)
        return blocks

    def retain(self, blocks: list[int]) -> None:
        """One more reference to each of `blocks` (a beam sharing another's full blocks)."""
        for block in blocks:
            if self._ref[block] == 0:
                self._evictable.pop(block, None)
            self._ref[block] += 1

    def copy_block(self, src: int, dst: int) -> None:
        """The keys and values of block `src` into block `dst` (every layer)."""
        n = self.tokens_per_block
        self.keys[:, dst * n:(dst + 1) * n] = self.keys[:, src * n:(src + 1) * n]
        self.values[:, dst * n:(dst + 1) * n] = self.values[:, src * n:(src + 1) * n]

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            self._ref[block] -= 1
            if self._ref[block] == 0:
                if block in self._hash_of:
                    self._evictable[block] = None
                else:
                    self._free.append(block)

    # --- reuse ---------------------------------------------------------------------------------
    def block_hashes(self, tokens: list[int], count: int, start: int = 0,
                     previous: int = 0) -> list[int]:
        """Chained hashes of full blocks `start .. start+count-1` of `tokens`."""
        n = self.tokens_per_block
        hashes = []
        for b in range(start, start + count):
            previous = hash((previous, tuple(tokens[b * n:(b + 1) * n])))
            hashes.append(previous)
        return hashes

    def match_prefix(self, tokens: list[int]) -> tuple[list[int], list[int]]:
        """Registered blocks that hold a prefix of `tokens`, referenced for the caller, and
        their hashes. At least the last token is left out, so the request still computes one
        token (it needs its logits). Each block's tokens and predecessor are verified."""
        if not self.enable_block_reuse:
            return [], []
        n = self.tokens_per_block
        full = (len(tokens) - 1) // n
        blocks, hashes = [], []
        previous = 0
        for b, h in enumerate(self.block_hashes(tokens, full)):
            block = self._block_of.get(h)
            if block is None:
                break
            serial, before, content = self._content[block]
            if before != previous or content != tuple(tokens[b * n:(b + 1) * n]):
                break  # a hash collision: not this prefix
            if self._ref[block] == 0:
                del self._evictable[block]
            self._ref[block] += 1
            blocks.append(block)
            hashes.append(h)
            previous = serial
        self.reused_blocks += len(blocks)
        return blocks, hashes

    def register(self, block: int, block_hash: int, tokens: list[int] | tuple[int, ...] = (),
                 previous_block: int | None = None) -> None:
        """`block` holds `tokens` after `previous_block` (None: it is the first): make it
        findable by its hash (first one wins)."""
        if self.enable_block_reuse and block_hash not in self._block_of and block not in self._hash_of:
            before = 0
            if previous_block is not None:
                entry = self._content.get(previous_block)
                if entry is None:
                    return  # its predecessor is not registered: nobody could match it
                before = entry[0]
            self._serial += 1
            self._block_of[block_hash] = block
            self._hash_of[block] = block_hash
            self._content[block] = (self._serial, before, tuple(tokens))

    def forget(self, blocks: list[int]) -> None:
        """Drop the registrations of `blocks` (their contents were never computed)."""
        for block in blocks:
            if block in self._hash_of:
                self._evictable.pop(block, None)
                self._unregister(block)
                if self._ref[block] == 0:
                    self._free.append(block)

    def _unregister(self, block: int) -> None:
        del self._block_of[self._hash_of.pop(block)]
        del self._content[block]
