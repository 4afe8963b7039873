# syntax=docker/dockerfile:1
#
# onebit's server image. Build and run (README, "Serve"):
#
#   docker build -t onebit .
#   docker run --rm -p 8080:8080 -v /path/to/model.gguf:/models/model.gguf:ro onebit
#
# serves the OpenAI API on port 8080 with the model mounted at /models/model.gguf. Arguments
# after the image name replace the CMD below: `docker run ... onebit serve -m ... --api-key K`.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# No `-C target-cpu=native`: onebit picks its kernels (amx, avx512, avx2, neon, scalar) at run
# time from what the CPU reports, so one portable build runs at full speed on any x86-64 (or
# aarch64) machine, which is what an image that moves between hosts needs. The cache mounts
# keep crates and build outputs between builds; the binary is copied out of the cached
# target folder in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release -p onebit-cli --locked \
    && install -m 0755 target/release/onebit /usr/local/bin/onebit

FROM debian:bookworm-slim
# ca-certificates only: `-m org/repo` downloads from Hugging Face over TLS. Versions are not
# pinned: rebuilding the image is how it gets Debian's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# A numeric, non-root user (Kubernetes' runAsNonRoot can only check a numeric one). Its home
# holds the caches (`-m org/repo` fills ~/.cache/huggingface); models are mounted at /models.
RUN groupadd --system --gid 10001 onebit \
    && useradd --system --uid 10001 --gid onebit --create-home --home-dir /home/onebit onebit \
    && mkdir /models
COPY --from=build /usr/local/bin/onebit /usr/local/bin/onebit
USER 10001:10001
ENV HOME=/home/onebit
WORKDIR /home/onebit
EXPOSE 8080
# /health answers 503 while the model loads and 200 once it serves. The slim image has no
# curl, and installing it would add libcurl and a dozen libraries to the image only for this;
# bash (always in Debian) opens the TCP connection itself through /dev/tcp, sends a plain
# HTTP/1.1 request and checks the status code. The start period gives a large model time to
# load. This check is for `docker run`/compose; Kubernetes ignores it and uses the probes of
# deploy/kubernetes.yaml. It asks port 8080: if you serve on another port, change it here.
HEALTHCHECK --interval=30s --timeout=5s --start-period=2m --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /health HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && read -r _ code _ <&3 && [ \"$code\" = 200 ]"]
ENTRYPOINT ["onebit"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "-m", "/models/model.gguf"]
