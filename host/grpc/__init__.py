"""gRPC front end (Triton's GRPCInferenceService): `start_grpc_server(host, address, port)`."""

from host.grpc.server import GrpcServer, start_grpc_server

__all__ = ["GrpcServer", "start_grpc_server"]
