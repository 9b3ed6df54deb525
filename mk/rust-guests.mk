# Rust guests built with the Rust SDK (sdk/rust) for wasm32-unknown-unknown.
# Each guest is its own crate (no dependencies but the SDK, by path); they share
# one cargo target directory so the SDK is compiled once. Builds are offline and
# use the committed Cargo.lock files (--locked).

RUST_TARGET_DIR := $(CURDIR)/target/rust
RUST_WASM_OUT := $(RUST_TARGET_DIR)/wasm32-unknown-unknown/release
RUST_SDK_SRC := sdk/rust/Cargo.toml $(wildcard sdk/rust/src/*.rs sdk/rust/src/*/*.rs)
# bulk-memory turns memcpy into memory.copy and simd128 lets LLVM vectorize byte
# loops: both are Wasm 2.0 core features that wazero enables by default, and
# together they make the uppercase map ~1.5x faster through the host.
RUST_WASM_FLAGS := -C target-feature=+bulk-memory,+simd128
RUST_BUILD = CARGO_TARGET_DIR=$(RUST_TARGET_DIR) CARGO_NET_OFFLINE=true RUSTFLAGS="$(RUST_WASM_FLAGS)" \
	$(CARGO) build --quiet --locked --offline \
	--target wasm32-unknown-unknown --release --manifest-path

# rust_guest(output, crate dir, artifact name)
define rust_guest
$(1): $(RUST_SDK_SRC) $(2)/Cargo.toml $(2)/Cargo.lock $(wildcard $(2)/src/*.rs)
	$$(RUST_BUILD) $(2)/Cargo.toml
	cp $(RUST_WASM_OUT)/$(3).wasm $$@
WASM_TARGETS += $(1)
endef

$(eval $(call rust_guest,examples/wasm/wordcount/split.wasm,examples/wasm/wordcount/split,wordcount_split))
$(eval $(call rust_guest,examples/wasm/wordcount/count.wasm,examples/wasm/wordcount/count,wordcount_count))
$(eval $(call rust_guest,examples/wasm/uppercase-rust/uppercase_rust.wasm,examples/wasm/uppercase-rust,uppercase_rust))
$(eval $(call rust_guest,internal/conformance/guests/rust/conformance.wasm,internal/conformance/guests/rust,conformance_rust))
$(eval $(call rust_guest,internal/conformance/guests/rust/mstate.wasm,internal/conformance/guests/rust/mstate,mstate_rust))
$(eval $(call rust_guest,internal/conformance/guests/rust/sideout.wasm,internal/conformance/guests/rust/sideout,sideout_rust))
$(eval $(call rust_guest,examples/wasm/topn-rust/topn_rust.wasm,examples/wasm/topn-rust,topn_rust))
# The typed-helper twins of uppercase-rust (internal/runtime BenchmarkTypedVsRaw): map_view, map_typed.
$(eval $(call rust_guest,internal/testguests/typedupper-rust/typedupper_rust.wasm,internal/testguests/typedupper-rust,typedupper_rust))
$(eval $(call rust_guest,internal/testguests/typedupper-rust-owned/typedupper_rust_owned.wasm,internal/testguests/typedupper-rust-owned,typedupper_rust_owned))

.PHONY: rust-guests test-rust-sdk
rust-guests: examples/wasm/wordcount/split.wasm examples/wasm/wordcount/count.wasm \
	examples/wasm/uppercase-rust/uppercase_rust.wasm internal/conformance/guests/rust/conformance.wasm \
	examples/wasm/topn-rust/topn_rust.wasm internal/conformance/guests/rust/mstate.wasm \
	internal/conformance/guests/rust/sideout.wasm \
	internal/testguests/typedupper-rust/typedupper_rust.wasm internal/testguests/typedupper-rust-owned/typedupper_rust_owned.wasm

# Native unit tests of the SDK's codecs and helpers (against its fake host).
test-rust-sdk:
	CARGO_TARGET_DIR=$(RUST_TARGET_DIR) CARGO_NET_OFFLINE=true $(CARGO) test --quiet --offline --manifest-path sdk/rust/Cargo.toml
