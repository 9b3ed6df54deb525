# Go guests built with the Go SDK (sdk/go): examples and the conformance operator.
# Each .wasm depends on its package's sources, the SDK and the shared helpers it imports.

GO_SDK_SRCS := $(filter-out %_test.go,$(wildcard sdk/go/*.go)) sdk/go/go.mod
WINDOW_LINE_SRCS := $(filter-out %_test.go,$(wildcard examples/wasm/window-count/line/*.go))

GO_GUESTS := \
	examples/wasm/uppercase/uppercase.wasm \
	examples/wasm/window-count/window-count.wasm \
	examples/wasm/window-count/keyby.wasm \
	internal/conformance/guests/go/conformance.wasm

WASM_TARGETS += $(GO_GUESTS)

.PHONY: go-guests
go-guests: $(GO_GUESTS)

examples/wasm/uppercase/uppercase.wasm: $(wildcard examples/wasm/uppercase/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/uppercase

examples/wasm/window-count/window-count.wasm: $(wildcard examples/wasm/window-count/*.go) $(WINDOW_LINE_SRCS) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/window-count

examples/wasm/window-count/keyby.wasm: $(wildcard examples/wasm/window-count/keyby/*.go) $(WINDOW_LINE_SRCS) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/window-count/keyby

internal/conformance/guests/go/conformance.wasm: $(wildcard internal/conformance/guests/go/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./internal/conformance/guests/go
