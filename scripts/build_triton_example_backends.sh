#!/usr/bin/env bash
# Build Triton's own example backends (identity, repeat) from their sources, against Triton's own
# headers, the way Triton's build links them (NEEDED libtritonserver.so), here against modelhost's
# bridge. Used to check that backends built for Triton load and serve unchanged in modelhost
# (docs/native.md). Needs g++, rapidjson headers (apt rapidjson-dev) and source checkouts of
# triton-inference-server/{core,backend,common,identity_backend,repeat_backend} under SRC:
#
#   scripts/build_triton_example_backends.sh SRC OUT
#   -> OUT/libtriton_identity.so, OUT/libtriton_repeat.so
set -euo pipefail
SRC=$(realpath "$1"); OUT=$(realpath -m "$2")
BRIDGE=$(python -c 'import importlib.util as u; print(u.find_spec("host.native.libtritonserver").origin)')
mkdir -p "$OUT"
common=("$SRC"/backend/src/backend_{common,model,model_instance,input_collector,output_responder,memory}.cc
        "$SRC"/common/src/{async_work_queue,thread_pool,error}.cc)
for name in identity repeat; do
    g++ -std=c++17 -shared -fPIC -O2 -I"$SRC/core/include" -I"$SRC/backend/include" -I"$SRC/common/include" \
        "$SRC/${name}_backend/src/${name}.cc" "${common[@]}" -o "$OUT/libtriton_${name}.so" \
        -L"$(dirname "$BRIDGE")" -l:"$(basename "$BRIDGE")" -lpthread
    echo "built $OUT/libtriton_${name}.so"
done
