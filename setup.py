"""The one compiled part of modelhost: the native bridge (host/native), built from its C sources.

Everything else is declared in pyproject.toml. The bridge is a Python extension module that is
also the library native Triton backends and caches link against: its soname is
`libtritonserver.so`, the name Triton's own builds of backends record as a dependency.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "host.native.libtritonserver",
            sources=[f"host/native/src/{name}.c" for name in
                     ("server", "backend", "request", "cache", "module", "infer", "allocator",
                      "control", "sequence", "unsupported")],
            include_dirs=["host/native/include"],
            depends=["host/native/src/bridge.h", "host/native/src/infer.h", "host/native/include/triton/core/tritonserver.h",
                     "host/native/include/triton/core/tritonbackend.h",
                     "host/native/include/triton/core/tritoncache.h"],
            extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
            extra_link_args=["-Wl,-soname,libtritonserver.so"],
            libraries=["dl", "pthread"],
        ),
        # SIGBUS guard for client shared-memory mappings (host/shm/system.py).
        Extension("host.shm._guard", sources=["host/shm/_guard.c"],
                  extra_compile_args=["-std=gnu11"]),
    ]
)
