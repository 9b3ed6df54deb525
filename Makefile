# streamd build. `make demo` runs the wordcount demo; `make test` runs the tests.
# Both install what a fresh Debian machine lacks (Rust's wasm32 target, wabt; chromium for the tests) first.

SHELL := /bin/bash
GO ?= go
CARGO := RUSTC=/usr/bin/rustc /usr/bin/cargo
BIN := bin/streamd

.PHONY: all deps wasm build test test-long bench demo clean

all: build wasm

# --- toolchain -------------------------------------------------------------
# Debian's rustc/cargo with the wasm32 std and wabt for the WAT fixtures;
# chromium for the web console's browser test only (deps-test).
deps:
	@if [ ! -x /usr/bin/cargo ] || [ ! -d /usr/lib/rustlib/wasm32-unknown-unknown ] || ! command -v wat2wasm >/dev/null; then \
		echo "installing rustc cargo libstd-rust-dev-wasm32 wabt from Debian"; \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustc cargo libstd-rust-dev-wasm32 wabt >/dev/null; \
	fi

.PHONY: deps-test
deps-test: deps
	@# The web console's browser test (internal/webapi) drives Debian's chromium, headless.
	@if ! command -v chromium >/dev/null; then \
		echo "installing chromium from Debian (for the web console's browser test)"; \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

build:
	$(GO) build -o $(BIN) ./cmd/streamd

# install puts streamd on PATH: `go install` into $(go env GOPATH)/bin
# (add that directory to PATH if it is not there).
.PHONY: install
install:
	$(GO) install ./cmd/streamd
	@echo "installed $$($(GO) env GOPATH)/bin/streamd"

# --- wasm guests -------------------------------------------------------------
GO_WASM = GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared

WASM_TARGETS :=

# Each family of guests has its own fragment that adds its outputs to WASM_TARGETS.
include $(sort $(wildcard mk/*.mk))

wasm: deps $(WASM_TARGETS)

# --- tests and benchmarks ------------------------------------------------------
test: deps-test wasm
	$(GO) vet ./...
	$(GO) vet -tags long ./...
	$(GO) test -count=1 -timeout 14m ./...
	$(MAKE) test-go-sdk

# The Go SDK is its own module (stdlib only), outside the root module's ./...
.PHONY: test-go-sdk
test-go-sdk:
	cd sdk/go && $(GO) vet ./... && GOOS=wasip1 GOARCH=wasm $(GO) vet ./... && $(GO) test -count=1 ./...

test-long: deps-test wasm
	$(GO) test -count=1 -timeout 60m -tags long ./...
	# Module loading under random bytes (seeded with real modules): no input may crash the process.
	$(GO) test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime 5m ./host

bench: deps wasm build
	$(GO) run ./internal/benchharness

demo: deps wasm build
	./scripts/demo.sh

clean:
	rm -rf bin $(WASM_TARGETS)
