# Spillway: `make run` builds and starts the demo; `make test` builds and runs every test.
# Both install missing Debian packages and build the pinned llama.cpp once into
# ~/.cache/spillway (see scripts/llama.sh).
BUILD ?= build
LISTEN ?= 127.0.0.1:8480
CMAKE_FLAGS ?=
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: all deps deps-app app build test run install bench pgo chaos fuzz clean

all: build

deps:
	@scripts/deps.sh

deps-app:
	@scripts/deps.sh --app

# Everything, the tests included (SPILLWAY_TESTS=ON, also where make run configured BUILD without them).
build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPILLWAY_TESTS=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD)

test: build
	@ctest --test-dir $(BUILD) --output-on-failure

# What make run and make install need (target app: the gateway, the worker, the demo's models). A BUILD not
# configured yet is configured without the tests (no test packages, whisper.cpp or test compiles: minutes
# less before a first run); one that has them keeps them.
app: deps-app
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  $(if $(wildcard $(BUILD)/CMakeCache.txt),,-DSPILLWAY_TESTS=OFF) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) --target app

run: app
	$(BUILD)/bin/spillway serve --listen $(LISTEN)

# Builds, then installs into PREFIX (staged under DESTDIR when set): binaries, llama.cpp's libraries and
# modules, the demo models, the systemd unit and user (README "Install as a service").
install: app
	@scripts/install.sh "$(BUILD)" "$(PREFIX)" "$(DESTDIR)"

# Builds the benchmarks, checks the bench preset's behaviour (make test checks
# the smaller presets), then spillway-worker against llama-bench.
bench: build
	@cmake --build $(BUILD) --target benches model_behaviour_test
	SPILLWAY_TEST_BENCH_MODELS=1 ctest --test-dir $(BUILD) -R model_behaviour_test --output-on-failure
	bench/worker_vs_llama.sh $(BUILD)
	bench/chat_turns.sh $(BUILD)

# Rebuilds BUILD's gateway with profile-guided and link-time optimisation (GCC): an instrumented gateway
# trained on bench/gateway_overhead's workload, then BUILD built with its profile (scripts/pgo.sh). Both stay
# on for later builds of BUILD; off again: cmake -DSPILLWAY_PGO= -DSPILLWAY_LTO=OFF $(BUILD).
pgo: deps
	@CMAKE_FLAGS="$(CMAKE_FLAGS)" scripts/pgo.sh "$(BUILD)"

# The proving suite's long form: every scenario for a minute, more than 1000
# injected faults, against both baselines; report in chaos-report/.
CHAOS_SEED ?= 1
chaos: build
	$(BUILD)/bin/spillway chaos --seed $(CHAOS_SEED) --duration 60 --faults 1100 --report chaos-report

# The fuzz targets for longer than make test's 10 s each (clang + libFuzzer).
FUZZ_SECONDS ?= 300
fuzz: build
	tests/fuzz/run.sh $(BUILD) $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(BUILD)-pgo-gen
