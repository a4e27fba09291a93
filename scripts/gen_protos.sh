#!/usr/bin/env bash
# Regenerate the Python protobuf modules in host/proto/ from every host/proto/*.proto.
#
# The .proto files are compiled with host/proto as the include root, so each is registered in
# protobuf's descriptor pool under its bare name ("model_config.proto"), exactly as Triton's
# tritonclient registers its copies. With identical content the two then share one registration
# and can be imported into the same process; under any other name the second import fails with
# "duplicate symbol 'inference.DataType'". A .proto importing another one therefore writes
# `import "model_config.proto";`.
#
# protoc emits bare imports (`import model_config_pb2`) for such files; the sed below makes them
# package-qualified (`from host.proto import model_config_pb2`). Needs grpcio-tools installed.
set -euo pipefail

cd "$(dirname "$0")/.."

shopt -s nullglob
protos=(host/proto/*.proto)
if [ ${#protos[@]} -eq 0 ]; then
    echo "no .proto files under host/proto" >&2
    exit 1
fi
names=("${protos[@]#host/proto/}")

# Service stubs (*_pb2_grpc.py) only for files that declare a service.
grpc_names=()
for name in "${names[@]}"; do
    if grep -qE '^[[:space:]]*service[[:space:]]' "host/proto/$name"; then
        grpc_names+=("$name")
    fi
done

python -m grpc_tools.protoc -Ihost/proto --python_out=host/proto --pyi_out=host/proto "${names[@]}"
if [ ${#grpc_names[@]} -gt 0 ]; then
    python -m grpc_tools.protoc -Ihost/proto --grpc_python_out=host/proto "${grpc_names[@]}"
fi

# Package-qualify imports of sibling generated modules, and the module name protobuf records on
# the message classes (so that messages pickle: pickle imports the class by that module name).
for generated in host/proto/*_pb2.py host/proto/*_pb2.pyi host/proto/*_pb2_grpc.py; do
    sed -i -E \
        -e 's/^import ([A-Za-z0-9_]+_pb2) as /from host.proto import \1 as /' \
        -e "s/(BuildTopDescriptorsAndMessages\(DESCRIPTOR, ')([A-Za-z0-9_]+_pb2)'/\1host.proto.\2'/" \
        "$generated"
done
