# (Named after rust-guests.mk, so that its rust_guest is defined when this is included.)
# The Nexmark queries (examples/nexmark, docs/nexmark.md): one Rust module
# for every query and one Go module for the stateless ones.

NEXMARK_GO_SRCS := $(filter-out %_test.go,$(wildcard examples/nexmark/go/*.go) $(wildcard sdk/go/nexmark/*.go))

$(eval $(call rust_guest,examples/nexmark/nexmark_rust.wasm,examples/nexmark/rust,nexmark_rust))

examples/nexmark/nexmark_go.wasm: $(NEXMARK_GO_SRCS) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/nexmark/go

WASM_TARGETS += examples/nexmark/nexmark_go.wasm

.PHONY: nexmark-guests
nexmark-guests: examples/nexmark/nexmark_rust.wasm examples/nexmark/nexmark_go.wasm
