# tildeopen-wgpu as a SageMaker-compatible inference container (endpoint and Batch Transform).
# SageMaker runs the image as `docker run IMAGE serve`, mounts the model under /opt/ml/model and
# sends requests to port 8080 (or $SAGEMAKER_BIND_TO_PORT): `tildeopen serve` picks all three up.
#
#   docker build -t tildeopen-wgpu .
#   docker run --rm -p 8080:8080 -v /path/to/model-dir:/opt/ml/model tildeopen-wgpu serve
#
# GPU: with an NVIDIA GPU, run with `--gpus all -e NVIDIA_DRIVER_CAPABILITIES=all` so the host's
# Vulkan driver is mounted; without one, Mesa's lavapipe (installed below) runs the same kernels on
# the CPU, slowly.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY shaders shaders
RUN cargo build --release --locked --bin tildeopen

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvulkan1 mesa-vulkan-drivers ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/tildeopen /usr/local/bin/tildeopen
ENV XDG_RUNTIME_DIR=/tmp
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/tildeopen"]
CMD ["serve"]
