# The two commands a new machine needs: `make demo` and `make test`. Both install what is
# missing (scripts/setup), build, then run.
BUILD ?= build
CMAKE_FLAGS ?=

.PHONY: setup build test demo clean

setup:
	@scripts/setup

build: setup
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)

test: build
	@ctest --test-dir $(BUILD) --output-on-failure -j2

# Trains a small Llama on 2 CPU ranks for a few minutes: the loss falls from ~5.6 to ~2, and the
# last checkpoint lands in .demo/checkpoints (HF safetensors + optimizer state).
demo: build
	@scripts/demo-data $(BUILD)/bin/loomctl
	@rm -rf .demo
	$(BUILD)/bin/loomctl run examples/jobs/train-llama.json

clean:
	rm -rf $(BUILD)
