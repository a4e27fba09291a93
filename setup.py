"""The compiled parts of modelhost: the native bridge (host/native), built from its C sources,
and two small extension modules (the shared-memory SIGBUS guard, the LLM decode-attention kernel).

Everything else is declared in pyproject.toml. The bridge is a Python extension module that is
also the library native Triton backends and caches link against: its soname is
`libtritonserver.so`, the name Triton's own builds of backends record as a dependency.

The bridge is optional: without a C compiler (or Python's headers) the build says so loudly and
modelhost installs without it; everything but native Triton backends and caches works, and a
model that needs one fails to load with the reason (host.native.bridge).
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

WARNING = """
*******************************************************************************************
modelhost: the native bridge (host/native) could not be compiled: {error}
modelhost installs WITHOUT native Triton backend and cache support (libtriton_*.so); every
plugin backend (python, onnxruntime, pytorch, ...) works. To have it, install a C compiler and
Python's headers (Debian/Ubuntu: apt-get install gcc python3-dev), then reinstall modelhost.
*******************************************************************************************
"""


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the bridge cannot be compiled."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler, no headers, a compile error
            self._skip(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._skip(exc, ext.name)

    def _skip(self, exc, name="host.native.libtritonserver"):
        text = str(exc).strip()
        error = text.splitlines()[-1] if text else type(exc).__name__
        if name != "host.native.libtritonserver":  # the small modules have a fallback each
            self.warn(f"modelhost: {name} could not be compiled ({error}); it is optional: "
                      "modelhost uses its pure-Python fallback")
            return
        message = WARNING.format(error=error)
        sys.stderr.write(message)
        self.warn(message)


setup(
    cmdclass={"build_ext": OptionalBuildExt},
    ext_modules=[
        Extension(
            "host.native.libtritonserver",
            sources=[f"host/native/src/{name}.c" for name in
                     ("server", "backend", "request", "cache", "module", "infer", "allocator",
                      "control", "sequence", "unsupported", "batching", "repoagent")],
            include_dirs=["host/native/include"],
            depends=["host/native/src/bridge.h", "host/native/src/infer.h", "host/native/include/triton/core/tritonserver.h",
                     "host/native/include/triton/core/tritonbackend.h",
                     "host/native/include/triton/core/tritoncache.h",
                     "host/native/include/triton/core/tritonrepoagent.h"],
            extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            extra_link_args=["-Wl,-soname,libtritonserver.so"],
            libraries=["dl", "pthread"],
            optional=True,
        ),
        # SIGBUS guard for client shared-memory mappings (host/shm/system.py).
        Extension("host.shm._guard", sources=["host/shm/_guard.c"],
                  extra_compile_args=["-std=gnu11"], optional=True),
        # Decode attention over the paged KV cache, float32 on the CPU (host/inflight/attention.py):
        # -fopenmp-simd vectorizes its marked loops without OpenMP's runtime.
        Extension("host.inflight._attention", sources=["host/inflight/_attention.c"],
                  extra_compile_args=["-std=gnu11", "-O3", "-fopenmp-simd"], libraries=["m", "pthread"],
                  optional=True),
    ]
)
