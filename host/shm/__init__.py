"""Client shared memory: system (POSIX) and CUDA regions a client registers by name.

`SharedMemoryManager` (registry.py) owns the one namespace of region names; `tensors.py` turns a
request's shared-memory references into array views of those regions and writes outputs back.
"""

from host.shm.registry import SharedMemoryManager
from host.shm.tensors import bind_request, mentions_shm, release_request, write_outputs

__all__ = ["SharedMemoryManager", "bind_request", "mentions_shm", "release_request", "write_outputs"]
