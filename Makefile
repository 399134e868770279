# The two commands of the README: `make demo` and `make test`. Both install the Debian packages
# fax needs (scripts/install-deps.sh, a no-op when present), configure a Release build with ccache
# and build it.

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test clean

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

clean:
	@rm -rf $(BUILD_DIR)
