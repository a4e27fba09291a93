"""The GPUs this server may use: the ids that instance groups of KIND_GPU can name.

Triton's rule (`GetSupportedGPUs`): every CUDA device the driver shows this process
(CUDA_VISIBLE_DEVICES applies) whose compute capability is at least
`--min-supported-compute-capability` (6.0 unless given). The driver API is asked through
ctypes (libcuda.so.1, present wherever the NVIDIA driver is), in a child process, so no CUDA
framework is imported and no CUDA context made here; without the driver, or with no device,
the set is empty.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
import sys

log = logging.getLogger(__name__)

DEFAULT_MIN_COMPUTE_CAPABILITY = 6.0
_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR

_min_capability = DEFAULT_MIN_COMPUTE_CAPABILITY


def configure(min_capability: float) -> None:
    """--min-supported-compute-capability (called once, at start-up)."""
    global _min_capability
    _min_capability = float(min_capability)


def min_capability() -> float:
    return _min_capability


def supported_gpus() -> frozenset[int]:
    """The ids of the CUDA devices at or above the minimum compute capability."""
    return frozenset(d for d, cc in _cuda_devices() if cc >= _min_capability)


@functools.lru_cache(maxsize=1)
def _cuda_devices() -> tuple[tuple[int, float], ...]:
    """(device id, compute capability) of every device the driver shows; () without a driver.

    Asked in a child process: a process that has initialized CUDA cannot use it in the children
    it forks (gunicorn's workers, process-mode stubs), so this one never does."""
    try:
        ctypes.CDLL("libcuda.so.1")  # loading the library initializes nothing
    except OSError:
        return ()
    try:
        out = subprocess.run([sys.executable, "-c", _QUERY], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not list the CUDA devices: %s", exc)
        return ()
    devices = []
    for line in out.split():
        device, _, capability = line.partition(":")
        devices.append((int(device), float(capability)))
    return tuple(devices)


# Prints "<id>:<major>.<minor>" per device, through the CUDA driver API.
_QUERY = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
n, dev, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
if cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0:
    for i in range(n.value):
        if (cuda.cuDeviceGet(ctypes.byref(dev), i) == 0
                and cuda.cuDeviceGetAttribute(ctypes.byref(major), %d, dev) == 0
                and cuda.cuDeviceGetAttribute(ctypes.byref(minor), %d, dev) == 0):
            print("%%d:%%d.%%d" %% (i, major.value, minor.value))
""" % (_CC_MAJOR, _CC_MINOR)
