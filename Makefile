# The two commands of the README: `make demo` and `make test`. Both install the Debian packages
# fax needs (scripts/install-deps.sh, a no-op when present), configure a Release build with ccache
# and build it.

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

ASAN_BUILD_DIR ?= build-asan
FUZZ_BUILD_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS = config idx leaf tff_hdf5 frame listener trace
# Sanitizer runtime settings for the test-asan suite (leak reports included).
SANITIZER_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizers/lsan.supp:print_suppressions=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: all deps configure build demo test test-asan fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	@$(BUILD_DIR)/bin/fax-run run experiments/fmnist_fedavg.yaml -o $(BUILD_DIR)/fmnist_fedavg.h5
	@$(BUILD_DIR)/bin/fax-run inspect $(BUILD_DIR)/fmnist_fedavg.h5 --last 3

test: build
	@ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer, in its own build tree.
# Left to `make test`: compile_fail and portability only run compilers; consumer checks the
# packaging (the same plugins run in-tree here); experiments checks the shipped files and their
# numbers through code the other cases run (docs/testing.md).
test-asan: deps
	@cmake -S . -B $(ASAN_BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFAX_SANITIZE=ON $(CMAKE_FLAGS)
	@cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	@$(SANITIZER_ENV) ctest --test-dir $(ASAN_BUILD_DIR) --output-on-failure -j $(JOBS) -LE "compile_fail|portability|consumer|experiments"

# libFuzzer (clang) on the config loader, the file readers (IDX, LEAF, TFF-HDF5, clock traces), the
# remote frame decoder and listener, FUZZ_SECONDS each,
# from the seed corpus in tests/fuzz/corpus; new inputs go to $(FUZZ_BUILD_DIR)/corpus.
fuzz: deps
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DFAX_FUZZ=ON -DFAX_BUILD_TESTS=OFF $(CMAKE_FLAGS)
	@cmake --build $(FUZZ_BUILD_DIR) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_BUILD_DIR)/corpus/$$t && \
		echo "fuzz: $$t for $(FUZZ_SECONDS) s" && \
		$(SANITIZER_ENV) $(FUZZ_BUILD_DIR)/bin/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-artifact_prefix=$(FUZZ_BUILD_DIR)/crash-$$t- $(FUZZ_BUILD_DIR)/corpus/$$t tests/fuzz/corpus/$$t \
			2> $(FUZZ_BUILD_DIR)/fuzz-$$t.log || { tail -60 $(FUZZ_BUILD_DIR)/fuzz-$$t.log; exit 1; }; \
		grep -E "stat::number_of_executed_units|stat::new_units_added" $(FUZZ_BUILD_DIR)/fuzz-$$t.log; \
	done

clean:
	@rm -rf $(BUILD_DIR) $(ASAN_BUILD_DIR) $(FUZZ_BUILD_DIR)
