#!/usr/bin/env bash
# Runs `onebit bench` and llama.cpp's `llama-bench` on the same model, tests and threads, one
# after the other, and prints both tables (the figures in BENCHMARKS.md come from this).
# usage: scripts/bench-vs-llama.sh MODEL.gguf "-p 512 -n 128" [THREADS=1,2] [REPS=3]
# LLAMA_BENCH points at llama-bench (build it with ../shared/tools/build-llama-cpp.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1 tests=$2 threads=${3:-1,2} reps=${4:-3}
llama=${LLAMA_BENCH:-llama-bench}
echo "### $(basename "$model") ($tests, threads $threads, $reps repetitions)"
# shellcheck disable=SC2086
./target/release/onebit bench -m "$model" $tests -t "$threads" -r "$reps"
# shellcheck disable=SC2086
LD_LIBRARY_PATH="$(dirname "$(command -v "$llama")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$llama" -m "$model" $tests -t "$threads" -r "$reps"
