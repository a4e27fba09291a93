#!/usr/bin/env bash
# Replay Triton's qa/L0_batch_custom (test.sh) against modelhost: the same five cases (single
# batching from the backend directory; volume batching from the backend, model and version
# directories and from TRITON_BATCH_STRATEGY_PATH) with its client batch_custom_test.py
# unchanged but for the ports, then the failing TRITONBACKEND_ModelBatcherInitialize. Triton's
# test uses the QA onnx model onnx_zero_1_float16 on onnxruntime; here a model of that name on
# Triton's identity backend (same inputs and outputs). Needs:
#   QA    a folder holding qa/common and qa/L0_batch_custom of the server repository
#   LIBS  the output folder of scripts/build_triton_example_backends.sh (libtriton_identity.so,
#         libtriton_{single,volume}batching.so)
#   SRC   the source folder given to that script (the volume strategy is rebuilt to fail)
#   scripts/run_triton_batch_custom_qa.sh QA LIBS SRC [HTTP_PORT GRPC_PORT METRICS_PORT]
set -uo pipefail
QA=$(realpath "$1"); LIBS=$(realpath "$2"); SRC=$(realpath "$3")
HP=${4:-26000}; GP=${5:-26001}; MP=${6:-26002}
PY=${PYTHON:-python}
BRIDGE=$($PY -c 'import importlib.util as u; print(u.find_spec("host.native.libtritonserver").origin)')
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
cp -r "$QA/qa" "$WORK/"; cd "$WORK/qa/L0_batch_custom"
sed -i "s/localhost:8000/localhost:$HP/g; s/localhost:8001/localhost:$GP/g; s/:8000\"/:$HP\"/g; s/:8001\"/:$GP\"/g" \
    batch_custom_test.py ../common/infer_util.py ../common/test_util.py
export PYTHONPATH="$WORK/qa/common${PYTHONPATH:+:$PYTHONPATH}"
BACKENDS="$WORK/backends"; BACKEND_DIR="$BACKENDS/identity"; mkdir -p "$BACKEND_DIR"
cp "$LIBS/libtriton_identity.so" "$BACKEND_DIR/"
MODEL_NAME=onnx_zero_1_float16; MODEL_DIR="models/$MODEL_NAME"; VERSION_DIR="$MODEL_DIR/1/"
CONFIG_PATH="$MODEL_DIR/config.pbtxt"
mkdir -p "$MODEL_DIR/1"
cat > "$CONFIG_PATH" <<'C'
name: "onnx_zero_1_float16"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP16 dims: [ -1, -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP16 dims: [ -1, -1 ] } ]
C
echo "dynamic_batching { max_queue_delay_microseconds: 10000}" >> "$CONFIG_PATH"
echo "instance_group [ { kind: KIND_CPU count: 2 }]" >> "$CONFIG_PATH"
echo "parameters { key: \"MAX_BATCH_VOLUME_BYTES\" value: {string_value: \"96\"}}" >> "$CONFIG_PATH"
cp "$LIBS/libtriton_volumebatching.so" "$LIBS/libtriton_singlebatching.so" models/
start() {
    local i
    timeout 300 $PY -m host serve --model-repository models --http-port "$HP" --grpc-port "$GP" \
        --metrics-port "$MP" --backend-directory "$BACKENDS" --log-verbose 1 --exit-on-error true > "$1" 2>&1 &
    SERVER_PID=$!
    for i in $(seq 120); do
        curl -sf "localhost:$HP/v2/health/ready" >/dev/null && return 0
        kill -0 $SERVER_PID 2>/dev/null || { SERVER_PID=0; return 1; }
        sleep 0.5
    done
    kill $SERVER_PID; SERVER_PID=0; return 1
}
test_types=('single_batching_backend' 'backend_directory' 'model_directory' 'version_directory' 'model_config')
test_setups=("cp models/libtriton_singlebatching.so ${BACKEND_DIR}/batchstrategy.so && sed -i \"s/(4, 5, 6))/(12))/\" batch_custom_test.py"
    "cp models/libtriton_volumebatching.so ${BACKEND_DIR}/batchstrategy.so && sed -i \"s/(12))/(4, 5, 6))/\" batch_custom_test.py"
    "mv ${BACKEND_DIR}/batchstrategy.so ${MODEL_DIR} && cp models/libtriton_singlebatching.so ${BACKEND_DIR}"
    "mv ${MODEL_DIR}/batchstrategy.so ${VERSION_DIR}/batchstrategy.so"
    "mv ${VERSION_DIR}/batchstrategy.so models/${MODEL_NAME}/libtriton_volumebatching.so && echo \"parameters: {key: \\\"TRITON_BATCH_STRATEGY_PATH\\\", value: {string_value: \\\"${MODEL_DIR}/libtriton_volumebatching.so\\\"}}\" >> ${CONFIG_PATH}")
RET=0
for i in "${!test_setups[@]}"; do
    eval "${test_setups[$i]}"
    LOG="server.log_${test_types[$i]}"
    if ! start "$LOG"; then echo "${test_types[$i]}: FAIL (server did not start)"; tail -5 "$LOG"; RET=1; continue; fi
    n=$(grep -c "Loading custom batching strategy" "$LOG")
    if [ "$n" != 1 ]; then echo "${test_types[$i]}: FAIL ($n strategy load lines)"; RET=1
    elif timeout 120 $PY batch_custom_test.py > "client.log_${test_types[$i]}" 2>&1; then echo "${test_types[$i]}: PASS"
    else echo "${test_types[$i]}: FAIL"; tail -5 "client.log_${test_types[$i]}"; RET=1; fi
    kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
done
# TRITONBACKEND_ModelBatcherInitialize fails: the server must not start, its log names the error
sed 's|// Batcher will point to an unsigned integer representing the maximum|return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_NOT_FOUND,"Failure test case");|' \
    "$SRC/backend/examples/batching_strategies/volume_batching/src/volume_batching.cc" > "$WORK/volume_fail.cc"
g++ -std=c++17 -shared -fPIC -O2 -I"$SRC/core/include" -I"$SRC/common/include" "$WORK/volume_fail.cc" \
    -o "models/${MODEL_NAME}/libtriton_volumebatching.so" -L"$(dirname "$BRIDGE")" -l:"$(basename "$BRIDGE")"
LOG=server.log_batching_init_failure
if start $LOG; then echo "batching_init_failure: FAIL (server started)"; kill $SERVER_PID; RET=1
elif [ "$(grep -c "Failure test case" $LOG)" -lt 1 ] || [ "$(grep -c "Not found" $LOG)" -lt 1 ]; then
    echo "batching_init_failure: FAIL (messages)"; tail -5 $LOG; RET=1
else echo "batching_init_failure: PASS"; fi
exit $RET
