"""Several front-end processes in front of one engine process (`--frontend-processes N`).

The engine process owns everything that makes the server one server: the Host (models,
schedulers, statistics, the response cache, shared-memory registrations, model control) and the
metrics endpoint. Each front-end process parses HTTP and gRPC and encodes answers, and reaches
the engine through `RemoteHost`, which has the Host's interface, over Unix sockets
(`host.frontend.wire`). See docs/process_model.md.
"""
