# Test guests of the task runtime (checkpoints, failover, upgrades): Go guests built with the Go SDK.
TEST_GUESTS := internal/testguests/failonce/failonce.wasm internal/testguests/countv2/countv2.wasm internal/testguests/failopen/failopen.wasm \
	internal/testguests/windows/windows.wasm internal/testguests/typedmap/typedmap.wasm internal/testguests/rawmap/rawmap.wasm

WASM_TARGETS += $(TEST_GUESTS)

.PHONY: test-guests
test-guests: $(TEST_GUESTS)

# test_guest(name): internal/testguests/<name>/<name>.wasm from its package.
define test_guest
internal/testguests/$(1)/$(1).wasm: $(wildcard internal/testguests/$(1)/*.go) $(GO_SDK_SRCS) go.mod
	$$(GO_WASM) -o $$@ ./internal/testguests/$(1)
endef
$(foreach g,failonce countv2 failopen typedmap rawmap,$(eval $(call test_guest,$(g))))

# windows: the Go SDK's window library (sdk/gotest runs it in the host and on the harness).
internal/testguests/windows/windows.wasm: $(wildcard internal/testguests/windows/*.go) $(wildcard internal/testguests/windowsop/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./internal/testguests/windows
