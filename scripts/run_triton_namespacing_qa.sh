#!/usr/bin/env bash
# Replay Triton's qa/L0_model_namespacing (test.sh) against modelhost: its four repository layouts
# (test_duplication, test_dynamic_resolution, test_ensemble_duplication, test_no_duplication),
# each served from its two repositories with --model-namespacing=true, first polling
# (--repository-poll-secs=2) then in explicit mode, with its client test.py unchanged but for
# the ports. As test.sh, the client starts once the server is ready. Needs:
#   QA    a folder holding qa/common and qa/L0_model_namespacing of the server repository
#   scripts/run_triton_namespacing_qa.sh QA [HTTP_PORT GRPC_PORT METRICS_PORT]
# SERVER (default: python -m host.tritonserver) is the command that serves; set it to Triton's
# tritonserver to run the same cases on Triton.
set -uo pipefail
QA=$(realpath "$1")
HP=${2:-26100}; GP=${3:-26101}; MP=${4:-26102}
PY=${PYTHON:-python}
SERVER=${SERVER:-$PY -m host.tritonserver}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
cp -r "$QA/qa" "$WORK/"; cd "$WORK/qa/L0_model_namespacing"
sed -i "s/localhost:8000/localhost:$HP/g; s/localhost:8001/localhost:$GP/g" test.py
export TRITON_QA_ROOT_DIR="$WORK/qa" TRITON_QA_PYTHON_MODEL_DIR="$PWD" PYTHONDONTWRITEBYTECODE=1
TESTS="test_duplication test_dynamic_resolution test_ensemble_duplication test_no_duplication"
for t in $TESTS; do for d in "$PWD/$t"/*/*; do mkdir -p "$d/1"; done; done
passed=0; failed=0
for suite in ModelNamespacePoll ModelNamespaceExplicit; do
    if [ $suite = ModelNamespacePoll ]; then
        MODE="--model-control-mode=POLL --repository-poll-secs=2"
    else
        MODE="--model-control-mode=EXPLICIT"
    fi
    for t in $TESTS; do
        rm -rf test_dir; cp -r "$t" test_dir
        $SERVER --model-namespacing=true --model-repository="$PWD/test_dir/addsub_repo" \
            --model-repository="$PWD/test_dir/subadd_repo" $MODE --http-port=$HP --grpc-port=$GP \
            --metrics-port=$MP > "$WORK/server.log" 2>&1 &
        pid=$!
        for _ in $(seq 240); do
            curl -sf -o /dev/null "localhost:$HP/v2/health/ready" && break
            kill -0 $pid 2>/dev/null || break
            sleep 0.5
        done
        if NAMESPACE_TESTING_DIRCTORY="$PWD/test_dir" timeout 120 $PY test.py "$suite.$t" \
                > "$WORK/test.log" 2>&1; then
            passed=$((passed + 1)); echo "PASS $suite.$t"
        else
            failed=$((failed + 1)); echo "FAIL $suite.$t"; tail -20 "$WORK/test.log"
        fi
        kill $pid 2>/dev/null
        for _ in $(seq 40); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
        kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
    done
done
echo "L0_model_namespacing: $passed passed, $failed failed"
[ $failed -eq 0 ]
