# Spillway: `make run` builds and starts the demo; `make test` builds and runs every test.
# Both install missing Debian packages and build the pinned llama.cpp once into
# ~/.cache/spillway (see scripts/llama.sh).
BUILD ?= build
LISTEN ?= 127.0.0.1:8480
CMAKE_FLAGS ?=

.PHONY: all deps build test run bench clean

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)

test: build
	@ctest --test-dir $(BUILD) --output-on-failure

run: build
	$(BUILD)/bin/spillway serve --listen $(LISTEN)

bench: build
	bench/worker_vs_llama.sh $(BUILD)

clean:
	rm -rf $(BUILD)
