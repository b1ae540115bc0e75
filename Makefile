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

demo: build
	$(BUILD)/bin/loomctl run examples/jobs/probe.json

clean:
	rm -rf $(BUILD)
