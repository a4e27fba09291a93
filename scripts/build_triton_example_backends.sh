#!/usr/bin/env bash
# Build Triton's own example backends (identity, repeat) from their sources, against Triton's own
# headers, the way Triton's build links them (NEEDED libtritonserver.so), here against modelhost's
# bridge. Used to check that backends built for Triton load and serve unchanged in modelhost
# (docs/native.md). Needs g++, rapidjson headers (apt rapidjson-dev) and source checkouts of
# triton-inference-server/{core,backend,common,identity_backend,repeat_backend} under SRC, and
# optionally server (for its sequence test backends) and square_backend (libtriton_square.so):
#
#   scripts/build_triton_example_backends.sh SRC OUT
#   -> OUT/libtriton_identity.so, OUT/libtriton_repeat.so, the backend repository's tutorial
#      backends OUT/libtriton_{minimal,recommended,bls}.so (bls: requests through the in-process
#      server API), its custom batching strategies OUT/libtriton_{single,volume}batching.so
#      (examples/batching_strategies, as Triton's L0_batch_custom builds them), and, with SRC/server,
#      libtriton_{sequence,dyna_sequence,implicit_state,iterative_sequence}.so
set -euo pipefail
SRC=$(realpath "$1"); OUT=$(realpath -m "$2")
BRIDGE=$(python -c 'import importlib.util as u; print(u.find_spec("host.native.libtritonserver").origin)')
mkdir -p "$OUT"
common=("$SRC"/backend/src/backend_{common,model,model_instance,input_collector,output_responder,memory}.cc
        "$SRC"/common/src/{async_work_queue,thread_pool,error}.cc)
build() {  # name source [extra g++ flags]
    g++ -std=c++17 -shared -fPIC -O2 -I"$SRC/core/include" -I"$SRC/backend/include" -I"$SRC/common/include" \
        "${@:3}" "$2" "${common[@]}" -o "$OUT/libtriton_$1.so" \
        -L"$(dirname "$BRIDGE")" -l:"$(basename "$BRIDGE")" -lpthread
    echo "built $OUT/libtriton_$1.so"
}
# With statistics and metrics on, as their CMake options default (Triton's build): identity then
# reports its own `input_byte_size_counter` metric through TRITONSERVER_Metric*.
for name in identity repeat; do
    build "$name" "$SRC/${name}_backend/src/${name}.cc" -DTRITON_ENABLE_STATS=1 -DTRITON_ENABLE_METRICS=1
done
# The backend repository's examples (examples/backends), served with its example repositories
# and clients (examples/model_repos, examples/clients) unchanged: checked 2026-11-27.
for name in minimal recommended; do
    build "$name" "$SRC/backend/examples/backends/$name/src/$name.cc"
done
build bls "$SRC/backend/examples/backends/bls/src/backend.cc" \
    "$SRC"/backend/examples/backends/bls/src/{bls,bls_utils}.cc
# Triton's `square` test backend (L0_response_statistics), when its checkout is there; built with
# statistics on, as Triton builds it, so that it reports per-response statistics.
if [ -d "$SRC/square_backend" ]; then
    build square "$SRC/square_backend/src/square.cc" -DTRITON_ENABLE_STATS
fi
# The backend repository's custom batching strategies (examples/batching_strategies): libraries
# a model names with TRITON_BATCH_STRATEGY_PATH or as batchstrategy.so (docs/native.md).
for name in single volume; do
    g++ -std=c++17 -shared -fPIC -O2 -I"$SRC/core/include" -I"$SRC/common/include" \
        "$SRC/backend/examples/batching_strategies/${name}_batching/src/${name}_batching.cc" \
        -o "$OUT/libtriton_${name}batching.so" -L"$(dirname "$BRIDGE")" -l:"$(basename "$BRIDGE")"
    echo "built $OUT/libtriton_${name}batching.so"
done
# Triton's sequence test backends (server/src/test, used by its L0_sequence_batcher and
# L0_implicit_state QA): when the server checkout is there. Their GPU branches call four CUDA
# runtime functions unconditionally; a CPU build gets stand-ins that are never reached.
if [ -d "$SRC/server/src/test" ]; then
    stub="$OUT/cuda_stub.h"
    cat > "$stub" <<'STUB'
#pragma once
#include <stddef.h>
typedef int cudaError_t;
typedef void* cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                      cudaMemcpyDeviceToDevice };
static const cudaError_t cudaSuccess = 0;
static inline cudaError_t cudaMemcpy(void*, const void*, size_t, cudaMemcpyKind) { return 1; }
static inline cudaError_t cudaMemcpyAsync(void*, const void*, size_t, cudaMemcpyKind,
                                          cudaStream_t) { return 1; }
static inline cudaError_t cudaMemset(void*, int, size_t) { return 1; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return 1; }
static inline const char* cudaGetErrorString(cudaError_t) { return "no CUDA"; }
#define LOG_IF_CUDA_ERROR(X, MSG) (void)(X)
STUB
    for name in sequence dyna_sequence implicit_state iterative_sequence; do
        build "$name" "$SRC/server/src/test/$name/src/$name.cc" -include "$stub"
    done
fi
