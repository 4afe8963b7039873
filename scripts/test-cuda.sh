#!/usr/bin/env bash
# The CUDA backend's tests, on a machine with an NVIDIA GPU, its driver and NVRTC (the CUDA
# toolkit, or pip's nvidia-cuda-nvrtc). Without a device every CUDA test says why and checks
# nothing, so this script first says whether there is one.
#   - crates/cuda/tests/kernels.rs: every weight format's product and row lookup against the
#     CPU's scalar dequantization, and the Q1_0 integer products;
#   - crates/model/tests/parity.rs `cuda::`: every fixture model and SmolLM2 on the GPU against
#     llama.cpp's logits and greedy continuations (f16 cache; f32 too on the fixture models).
# Usage: scripts/test-cuda.sh   (run `make fetch-model` first for SmolLM2)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; then
  echo "no NVIDIA GPU or driver here: the CUDA tests would skip; run this where one is" >&2
  exit 1
fi
# cudarc looks for libnvrtc.so (or .so.12); the toolkit's lib directory has the unversioned name.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
cargo test -p onebit-cuda -- --test-threads 1
cargo test -p onebit-model --test parity cuda:: -- --test-threads 1
