"""Generated protobuf modules (``*_pb2.py``, ``*_pb2.pyi``, ``*_pb2_grpc.py``).

Everything here except the ``.proto`` sources is generated code and never hand-edited:
edit the ``.proto`` file and regenerate with ``scripts/gen_protos.sh``.
"""
