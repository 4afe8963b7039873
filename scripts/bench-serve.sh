#!/usr/bin/env bash
# onebit serve and llama.cpp's llama-server under the same load (scripts/loadtest.py), one after
# the other, with the same flags: 16 sequences at once, 2 threads, `CTX` positions per sequence.
# usage: scripts/bench-serve.sh MODEL OUTDIR [MAX_TOKENS] [LEVELS]
#   LLAMA_BIN=dir of llama-server (default /work/ref/llama/build/bin), PY=python with openai,
#   SERVERS=onebit,llama (which to run), ENDPOINT=chat|completions (a random-weights model's
#   chat output may be all "thinking", which llama-server does not stream as text: use completions)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1 out=$2 max_tokens=${3:-128} levels=${4:-1,4,16,64}
np=16 ctx=${CTX:-512}
llama_bin=${LLAMA_BIN:-/work/ref/llama/build/bin}
py=${PY:-${XDG_CACHE_HOME:-$HOME/.cache}/onebit/venv-openai/bin/python}
onebit=${ONEBIT:-target/release/onebit}
mkdir -p "$out"
pid=""
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true' EXIT

wait_ready() {
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/health")" = 200 ] && return 0
    sleep 0.2
  done
  echo "server on port $1 never became ready" >&2
  exit 1
}

run_levels() { # name port
  IFS=, read -ra ls <<<"$levels"
  for c in "${ls[@]}"; do
    # Enough requests for stable percentiles, few enough that the slowest server finishes.
    n=${REQUESTS:-$((c < 4 ? 8 : 2 * c))}
    [ "$c" -lt 64 ] || n=$c
    "$py" scripts/loadtest.py --base-url "http://127.0.0.1:$2/v1" --concurrency "$c" --requests "$n" \
      --max-tokens "$max_tokens" --endpoint "${ENDPOINT:-chat}" --warmup 2 --pid "$pid" --json "$out/$1-c$c.json" | tail -n 3
  done
}

servers=${SERVERS:-onebit,llama}
if [[ $servers == *onebit* ]]; then
# Plain decoding, as llama-server does by default (onebit drafts by prompt lookup unless told).
"$onebit" serve -m "$model" --port 18181 -t 2 --parallel $np -c "$ctx" --queue-size 256 --spec off 2>"$out/onebit.log" &
pid=$!
wait_ready 18181
echo "== onebit serve"
run_levels onebit 18181
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
fi

[[ $servers == *llama* ]] || exit 0
LD_LIBRARY_PATH=$llama_bin "$llama_bin/llama-server" -m "$model" --port 18182 -t 2 -np $np -c $((np * ctx)) \
  2>"$out/llama.log" >/dev/null &
pid=$!
wait_ready 18182
echo "== llama-server"
run_levels llama 18182
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
