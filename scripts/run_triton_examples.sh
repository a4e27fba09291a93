#!/usr/bin/env bash
# Run Triton's own python example clients against a running server (modelhost or tritonserver).
# Not used by CI, and fetches nothing: point it at a checkout of triton-inference-server/client.
#
#   modelhost serve --model-repository tests/client_models --id triton --allow-client-shm=true \
#       --model-control-mode explicit --load-model '*' --http-port 8000 --grpc-port 8001 &
#   scripts/run_triton_examples.sh ~/src/client/src/python/examples localhost:8000 localhost:8001
#
# tests/client_models holds python-backend models with the names, configs and answers of Triton's
# docs/examples/model_repository (plus simple_string_dyna_sequence, for --dyna). Each program must
# print its PASS line and exit 0. See docs/conformance.md.
set -u
EXAMPLES=${1:?usage: $0 EXAMPLES_DIR [HTTP_URL] [GRPC_URL]}
HTTP=${2:-localhost:8000}
GRPC=${3:-localhost:8001}
PY=${PYTHON:-python}
failed=0

run() {  # run NAME URL [ARGS...]
  local name=$1 url=$2; shift 2
  if out=$(timeout 120 "$PY" "$EXAMPLES/$name.py" -u "$url" "$@" 2>&1); then
    echo "PASS  $name $*"
  else
    echo "FAIL  $name $*"; echo "$out" | tail -5 | sed 's/^/      /'; failed=$((failed + 1))
  fi
}

for name in simple_http_infer_client simple_http_async_infer_client simple_http_aio_infer_client \
    simple_http_health_metadata simple_http_shm_client simple_http_shm_string_client \
    simple_http_string_infer_client reuse_infer_objects_client; do
  run $name "$HTTP"
done
run simple_http_sequence_sync_infer_client "$HTTP"
run simple_http_sequence_sync_infer_client "$HTTP" -d -o 10
for name in simple_grpc_infer_client simple_grpc_async_infer_client simple_grpc_aio_infer_client \
    simple_grpc_health_metadata simple_grpc_shm_client simple_grpc_shm_string_client \
    simple_grpc_string_infer_client simple_grpc_custom_args_client simple_grpc_keepalive_client \
    grpc_explicit_byte_content_client grpc_explicit_int8_content_client \
    grpc_explicit_int_content_client; do
  run $name "$GRPC"
done
for name in simple_grpc_sequence_sync_infer_client simple_grpc_sequence_stream_infer_client \
    simple_grpc_aio_sequence_stream_infer_client; do
  run $name "$GRPC"
  run $name "$GRPC" -d -o 20
done
run reuse_infer_objects_client "$GRPC" -i grpc
# Last: these unload 'simple'. The gRPC one counts 8 models in the repository (Triton's docs
# repository), the HTTP one 7; tests/client_models has 7, so add a model for the gRPC one.
run simple_http_model_control "$HTTP"
run simple_grpc_model_control "$GRPC"
echo "$failed failed"
exit $((failed > 0))
