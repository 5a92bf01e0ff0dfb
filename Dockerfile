# tildeopen-wgpu as a SageMaker-compatible inference container (endpoint and Batch Transform).
# SageMaker runs the image as `docker run IMAGE serve`, mounts the model under /opt/ml/model and
# sends requests to port 8080 (or $SAGEMAKER_BIND_TO_PORT): `tildeopen serve` picks all three up.
#
#   docker build -t tildeopen-wgpu .                       # --build-arg GPU=1: no lavapipe
#   docker run --rm -p 8080:8080 -v /path/to/model-dir:/opt/ml/model tildeopen-wgpu serve
#   scripts/container                                       # builds (binary from the host) and checks it
#
# GPU: with an NVIDIA GPU, run with `--gpus all -e NVIDIA_DRIVER_CAPABILITIES=all` so the host's
# Vulkan driver is mounted; without one, Mesa's lavapipe (installed below) runs the same kernels on
# the CPU, slowly.

ARG BASE=debian:bookworm-slim

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY shaders shaders
RUN cargo build --release --locked --bin tildeopen

# The runtime without the binary. GPU=1 leaves out Mesa's lavapipe (a CPU Vulkan driver, most of
# the image): the host's driver is mounted at run time (--gpus all).
FROM ${BASE} AS runtime
ARG GPU=0
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvulkan1 ca-certificates \
 && if [ "$GPU" != 1 ]; then apt-get install -y --no-install-recommends mesa-vulkan-drivers; fi \
 && rm -rf /var/lib/apt/lists/*
ENV XDG_RUNTIME_DIR=/tmp
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/tildeopen"]
CMD ["serve"]

# With a binary built outside (scripts/container: where no Rust image can be pulled), copied
# from the build context's prebuilt/tildeopen.
FROM runtime AS prebuilt
COPY prebuilt/tildeopen /usr/local/bin/tildeopen

FROM runtime
COPY --from=build /src/target/release/tildeopen /usr/local/bin/tildeopen
