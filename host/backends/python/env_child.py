"""A one-shot child run in a python model's execution environment (host.backends.python.envs):
the model's `auto_complete_config`, which imports the model file, so it must run where the
model's packages are. Reads a pickled model description on standard input and writes a pickled
answer on standard output: ("ok", serialized ModelConfig) or ("error", code name, message)."""

from __future__ import annotations

import pickle
import sys


def main() -> None:
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever the model prints does not mix with the answer
    request = pickle.loads(sys.stdin.buffer.read())
    from host.backend import ModelSpec
    from host.backends.python.backend import auto_complete, triton_stub_argv
    from host.errors import HostError
    from host.proto import model_config_pb2

    triton_stub_argv()
    config = model_config_pb2.ModelConfig.FromString(request["config"])
    spec = ModelSpec(name=request["name"], version=request["version"],
                     repository=request["repository"], path=request["path"], config=config,
                     backend="python")
    try:
        completed = auto_complete(spec, request["backend_model"])
        answer: tuple = ("ok", (completed if completed is not None else config).SerializeToString())
    except HostError as exc:
        answer = ("error", exc.code.name, exc.message)
    out.write(pickle.dumps(answer))
    out.flush()


if __name__ == "__main__":
    main()
