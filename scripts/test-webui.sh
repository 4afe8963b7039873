#!/usr/bin/env bash
# Headless-browser test of the chat page that `onebit serve` shows at `/`: streaming, Stop,
# Markdown, the speed line, errors, conversations in localStorage, and (on a second server
# started with --api-key) the key prompt. Needs node/npm; Chromium comes from
# ../shared/tools/get-chromium.sh (Debian's chromium-headless-shell).
#
#   bash scripts/test-webui.sh [BINARY]     # default: $ONEBIT or target/release/onebit
#
# MODEL overrides the model (default: the demo model in onebit's cache, `make fetch-model`).
set -euo pipefail
BIN=${1:-${ONEBIT:-}}
[ -z "$BIN" ] || BIN=$(realpath "$BIN")
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/onebit}
MODEL=${MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/onebit/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$BIN" ] || { echo "test-webui: no binary at $BIN (cargo build --release -p onebit-cli)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "test-webui: no model at $MODEL (make fetch-model)" >&2; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "test-webui: needs node and npm" >&2; exit 1; }

CHROME=$(bash ../shared/tools/get-chromium.sh)
(cd scripts/webui-test && npm install --no-audit --no-fund --loglevel=error >/dev/null)
echo "test-webui: $("$CHROME" --version 2>/dev/null || echo "$CHROME"), puppeteer-core $(node -p 'require("./scripts/webui-test/node_modules/puppeteer-core/package.json").version') (${SECONDS} s)"

WORK=$(mktemp -d)
PID=""
# SIGTERM, and SIGKILL if the server is still there after 10 s (its grace period is longer).
stop_server() {
  if [ -n "$PID" ]; then
    kill "$PID" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$PID" 2>/dev/null; then
      echo "test-webui: the server did not stop within 10 s of SIGTERM; killing it" >&2
      kill -9 "$PID" 2>/dev/null || true
    fi
    wait "$PID" 2>/dev/null || true
    PID=""
  fi
}
trap 'stop_server; rm -rf "$WORK"' EXIT

# Starts the server on a free port with the given extra flags; sets PID and URL.
start_server() {
  local port
  port=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
  "$BIN" serve -m "$MODEL" --host 127.0.0.1 --port "$port" -t 2 "$@" >"$WORK/server.log" 2>&1 &
  PID=$!
  URL="http://127.0.0.1:$port"
  for _ in $(seq 1 120); do
    if ! kill -0 "$PID" 2>/dev/null; then
      echo "test-webui: the server exited:" >&2; cat "$WORK/server.log" >&2; exit 1
    fi
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health" || true)" = 200 ] && return 0
    sleep 0.5
  done
  echo "test-webui: the server did not become healthy in 60 s:" >&2; cat "$WORK/server.log" >&2; exit 1
}

run_test() {
  echo "test-webui: $URL, the page's test$([ $# = 0 ] || echo ' with --api-key') (${SECONDS} s)"
  if ! timeout 180 node scripts/webui-test/test.mjs --url "$URL" --chrome "$CHROME" "$@"; then
    echo "test-webui: FAILED; the server's log:" >&2; tail -n 30 "$WORK/server.log" >&2
    exit 1
  fi
}

start_server
run_test
stop_server

KEY="webui-test-$RANDOM$RANDOM"
start_server --api-key "$KEY"
run_test --api-key "$KEY"
stop_server
echo "test-webui: passed in ${SECONDS} s"
