"""`import c_python_backend_utils` for Triton python-backend models run by modelhost.

In Triton this is the stub's compiled module that `triton_python_backend_utils` re-exports; a few
models import it directly (`c_python_backend_utils.shared_memory.free_memory()`, the classes).
Here it re-exports the same API from `host.backends.python.pb_utils`, plus `shared_memory`.
"""

from host.backends.python.pb_utils import *  # noqa: F401,F403
from host.backends.python.pb_utils import __all__ as _pb_all


class _SharedMemory:
    """Triton's stub's shared-memory pool. Models run in the server's process here and their
    tensors are not copied through a pool: the whole default pool size counts as free, so that a
    model comparing `free_memory()` before and after some work sees no leak."""

    _DEFAULT_BYTE_SIZE = 1024 * 1024  # Triton's default shm-default-byte-size

    def free_memory(self) -> int:
        return self._DEFAULT_BYTE_SIZE


shared_memory = _SharedMemory()

__all__ = [*_pb_all, "shared_memory"]
