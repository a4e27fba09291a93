#!/usr/bin/env bash
# Install modelhost and its plugins into a fresh virtual environment at PREFIX: the one install
# step of the container image (Dockerfile, build stages), and what tests/test_container.py runs
# to test the image's contents without Docker.
#
#   scripts/build_rootfs.sh PREFIX [cpu|cuda]
#
# Run from a checkout. Needs python3 (with venv), and a C compiler with Python's headers for the
# native bridge (without them modelhost installs without native-backend support, and says so).
# PLUGINS (space-separated folders under plugins/) picks the plugins; the default serves ONNX
# models and shares a response cache through Redis. modelhost-pytorch adds PyTorch (large).
set -euo pipefail
PREFIX=${1:?usage: build_rootfs.sh PREFIX [cpu|cuda]}
VARIANT=${2:-cpu}
PLUGINS=${PLUGINS:-"modelhost-onnxruntime modelhost-redis-cache"}
PYTHON=${PYTHON:-python3}
cd "$(dirname "$0")/.."

"$PYTHON" -m venv "$PREFIX"
PIP=("$PREFIX/bin/python" -m pip install --no-cache-dir --disable-pip-version-check -q)
# modelhost first (a wheel built from this checkout), then the plugins, which require it.
"${PIP[@]}" ".[s3,gcs,azure]"  # model repositories in S3, GCS and Azure Blob Storage (host.storage)
args=()
for plugin in $PLUGINS; do
    if [ "$plugin" = modelhost-onnxruntime ] && [ "$VARIANT" = cuda ]; then
        args+=("./plugins/$plugin[gpu]")
    else
        args+=("./plugins/$plugin")
    fi
done
[ ${#args[@]} -eq 0 ] || "${PIP[@]}" "${args[@]}"
if [ "$VARIANT" = cuda ]; then
    # the GPU build of onnxruntime replaces the CPU one (both install the `onnxruntime` module)
    "$PREFIX/bin/python" -m pip uninstall -q -y onnxruntime || true
    "${PIP[@]}" --force-reinstall --no-deps "onnxruntime-gpu>=1.17"
    "${PIP[@]}" "cupy-cuda12x>=13"   # CUDA shared memory (modelhost[cuda])
fi
# pip is not needed at run time. The bytecode pip compiled stays: the image's root filesystem
# may be read-only (deploy/kubernetes), where Python could not write it at start-up.
"$PREFIX/bin/python" -m pip uninstall -q -y pip setuptools wheel 2>/dev/null || true
echo "modelhost installed in $PREFIX ($VARIANT): $("$PREFIX/bin/modelhost" --version)"
