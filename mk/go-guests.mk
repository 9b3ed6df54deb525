# Go guests built with the Go SDK (sdk/go): examples and the conformance operator.
# Each .wasm depends on its package's sources, the SDK and the shared helpers it imports.

GO_SDK_SRCS := $(filter-out %_test.go,$(wildcard sdk/go/*.go)) sdk/go/go.mod
WINDOW_LINE_SRCS := $(filter-out %_test.go,$(wildcard examples/wasm/window-count/line/*.go))
KEYBY_SRCS := $(filter-out %_test.go,$(wildcard examples/wasm/internal/keyby/*.go))
UPPER_SRCS := $(filter-out %_test.go,$(wildcard examples/wasm/internal/upper/*.go))

GO_GUESTS := \
	examples/wasm/uppercase/uppercase.wasm \
	examples/wasm/uppercase/typed.wasm \
	examples/wasm/window-count/window-count.wasm \
	examples/wasm/window-count/keyby.wasm \
	internal/conformance/guests/go/conformance.wasm \
	internal/conformance/guests/go/mstate.wasm \
	internal/conformance/guests/go/sideout.wasm \
	examples/wasm/sessionize/sessionize.wasm \
	examples/wasm/sessionize/keyby.wasm \
	examples/wasm/interval-join/interval-join.wasm \
	examples/wasm/interval-join/keyby.wasm

WASM_TARGETS += $(GO_GUESTS)

.PHONY: go-guests
go-guests: $(GO_GUESTS)

examples/wasm/uppercase/uppercase.wasm: $(wildcard examples/wasm/uppercase/*.go) $(UPPER_SRCS) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/uppercase

# The same map with the typed helpers, MapOf(String, String) (internal/runtime BenchmarkTypedVsRaw).
examples/wasm/uppercase/typed.wasm: $(wildcard examples/wasm/uppercase/typed/*.go) $(UPPER_SRCS) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/uppercase/typed

examples/wasm/window-count/window-count.wasm: $(wildcard examples/wasm/window-count/*.go) $(WINDOW_LINE_SRCS) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/window-count

examples/wasm/window-count/keyby.wasm: $(wildcard examples/wasm/window-count/keyby/*.go) $(WINDOW_LINE_SRCS) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/window-count/keyby

internal/conformance/guests/go/conformance.wasm: $(wildcard internal/conformance/guests/go/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./internal/conformance/guests/go

internal/conformance/guests/go/mstate.wasm: $(wildcard internal/conformance/guests/go/mstate/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./internal/conformance/guests/go/mstate

internal/conformance/guests/go/sideout.wasm: $(wildcard internal/conformance/guests/go/sideout/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./internal/conformance/guests/go/sideout

# sessionize and interval-join (SPEC14: windows, typed state, side outputs) share the keyby stage
# of examples/wasm/internal/keyby; they need a host with the SPEC14 imports.
examples/wasm/sessionize/sessionize.wasm: $(wildcard examples/wasm/sessionize/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/sessionize

examples/wasm/interval-join/interval-join.wasm: $(wildcard examples/wasm/interval-join/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/interval-join

examples/wasm/%/keyby.wasm: examples/wasm/%/keyby/main.go $(KEYBY_SRCS) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./examples/wasm/$*/keyby
