# syntax=docker/dockerfile:1
# modelhost images, multi-stage: a build stage compiles and installs into /opt/modelhost (a
# virtual environment), the final stage copies only that onto a slim base.
#
#   docker build -t modelhost:0.1.0-cpu .                      # CPU (the default target)
#   docker build -t modelhost:0.1.0-cuda --target cuda .       # CUDA 12 (onnxruntime-gpu, cupy)
#   docker run -p 8000-8002:8000-8002 -v "$PWD/model_repository:/models:ro" modelhost:0.1.0-cpu
#
# The install step is scripts/build_rootfs.sh, which tests/test_container.py runs the same way
# and then serves from (Docker itself does not run in this project's CI).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# --- CUDA: build, then runtime ------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS build-cuda
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev python3 python3-dev python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG PLUGINS="modelhost-onnxruntime modelhost-redis-cache"
RUN PLUGINS="$PLUGINS" scripts/build_rootfs.sh /opt/modelhost cuda

FROM ${CUDA_IMAGE} AS cuda
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 modelhost \
 && useradd --system --uid 10001 --gid modelhost --home-dir /nonexistent --shell /usr/sbin/nologin modelhost
COPY --from=build-cuda /opt/modelhost /opt/modelhost
COPY deploy/container/modelhost.toml /etc/modelhost/modelhost.toml
ENV PATH=/opt/modelhost/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MODELHOST_CONFIG_FILE=/etc/modelhost/modelhost.toml
USER 10001:10001
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/opt/modelhost/bin/python", "-m", "host.healthcheck"]
ENTRYPOINT ["/opt/modelhost/bin/modelhost"]
CMD ["serve"]

# --- CPU: build, then runtime (the default target: last in the file) ------------------------------
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
ARG PLUGINS="modelhost-onnxruntime modelhost-redis-cache"
RUN PLUGINS="$PLUGINS" scripts/build_rootfs.sh /opt/modelhost cpu

FROM ${PYTHON_IMAGE} AS cpu
RUN groupadd --system --gid 10001 modelhost \
 && useradd --system --uid 10001 --gid modelhost --home-dir /nonexistent --shell /usr/sbin/nologin modelhost
COPY --from=build /opt/modelhost /opt/modelhost
COPY deploy/container/modelhost.toml /etc/modelhost/modelhost.toml
ENV PATH=/opt/modelhost/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MODELHOST_CONFIG_FILE=/etc/modelhost/modelhost.toml
USER 10001:10001
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/opt/modelhost/bin/python", "-m", "host.healthcheck"]
ENTRYPOINT ["/opt/modelhost/bin/modelhost"]
CMD ["serve"]
