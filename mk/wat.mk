# Hand-written WAT guests and host test fixtures, built with wabt's wat2wasm.
WAT2WASM ?= wat2wasm

WAT_SOURCES := $(sort $(wildcard internal/conformance/guests/wat/*.wat)) $(sort $(wildcard host/testdata/*.wat))
WAT_WASM := $(WAT_SOURCES:.wat=.wasm)

WASM_TARGETS += $(WAT_WASM)

$(WAT_WASM): %.wasm: %.wat
	$(WAT2WASM) $< -o $@
