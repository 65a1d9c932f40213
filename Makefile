# minamp front door. `make demo` and `make test` install missing Debian packages, configure,
# build and run; nothing relies on what happens to be installed.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: help deps configure build demo test test-emulated test-sanitize fuzz bench clean format

help:
	@echo "minamp — a minimal mixed-precision training framework (C++17, CUDA)"
	@echo ""
	@echo "  make demo           train the quantized-sine conv net (FP32 vs AMP) and write images"
	@echo "  make test           build and run the test suite (GPU tests skip without a GPU, and run"
	@echo "                      on the CPU emulator of the CUDA backend where CUDA headers are)"
	@echo "  make test-emulated  only the GPU tests run on the CUDA emulator (the CUDA sources on the CPU)"
	@echo "  make test-sanitize  run the CPU and emulated GPU tests under AddressSanitizer + UBSan"
	@echo "  make fuzz           fuzz the file loaders with libFuzzer (clang), FUZZ_SECONDS=60 each"
	@echo "  make bench          run the CPU benchmarks, results under bench/results/"
	@echo "  make build          configure and build only (BUILD=$(BUILD))"
	@echo "  make format         clang-format every source file"
	@echo "  make clean          remove build directories"

$(DEPS_STAMP): scripts/install-deps.sh
	@bash scripts/install-deps.sh
	@mkdir -p $(BUILD) && touch $@

deps: $(DEPS_STAMP)

configure: $(DEPS_STAMP)
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@$(BUILD)/sine --compare --out out/sine
	@echo "images (target left, prediction right): out/sine/fp32/sine.png out/sine/amp/sine.png"

# ctest hides the output of skipped tests, so say once why the GPU tests skip (if they do).
test: build
	@$(BUILD)/minamp_tests --gtest_filter='GpuDevice.*' 2>&1 | grep -m1 '^no GPU' \
	  | sed 's/^/GPU tests will be skipped: /' || true
	@[ ! -x $(BUILD)/minamp_tests_emulated ] || \
	  echo "GPU tests also run on the CPU emulator of the CUDA backend, as emulated.*"
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The GPU tests on the CPU emulator only (`make test` runs them too, as emulated.*):
# cuda/emulator/ compiles the same CUDA sources for the CPU; it needs the CUDA headers, not a GPU.
test-emulated: build
	@cd $(BUILD) && ctest -R '^emulated\.' --output-on-failure -j $(JOBS)

# Emulated device memory is exact-size blocks freed at once there (MINAMP_CUDA_EXACT_ALLOC), so
# that AddressSanitizer also sees a kernel that reads past a tensor or into a freed one.
test-sanitize:
	@MINAMP_CUDA_EXACT_ALLOC=1 $(MAKE) --no-print-directory test BUILD=build-sanitize \
	  CMAKE_FLAGS="-DMINAMP_CUDA=OFF -DMINAMP_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo"

# Coverage-guided fuzzing of the file loaders (tests/fuzz/, scripts/fuzz.sh): clang's libFuzzer
# with AddressSanitizer + UBSan, in a build of its own (the CPU backend only).
fuzz:
	@bash scripts/install-deps.sh fuzz
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DMINAMP_FUZZ=ON -DMINAMP_CUDA=OFF -DMINAMP_CUDA_EMULATOR=OFF >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target minamp_fuzz minamp_fuzz_replay
	@BUILD=build-fuzz bash scripts/fuzz.sh

bench: build
	@bash bench/run-cpu.sh $(BUILD)

format:
	@clang-format -i $$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')

clean:
	rm -rf build build-*
