# Test guests of the task runtime (checkpoints, failover): Go guests built with the Go SDK.
TEST_GUESTS := internal/testguests/failonce/failonce.wasm

WASM_TARGETS += $(TEST_GUESTS)

.PHONY: test-guests
test-guests: $(TEST_GUESTS)

internal/testguests/failonce/failonce.wasm: $(wildcard internal/testguests/failonce/*.go) $(GO_SDK_SRCS) go.mod
	$(GO_WASM) -o $@ ./internal/testguests/failonce
