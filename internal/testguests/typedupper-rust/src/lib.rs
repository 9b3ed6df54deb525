//! The ASCII upper-case map of `examples/wasm/uppercase-rust`, written with
//! the typed helpers over the `Str` codec: the typed side of
//! BenchmarkTypedVsRaw (internal/runtime). `map_view` lends the value as a
//! checked `&str` and the result goes straight into the output frame.

use streamd::{Str, StrWriter};

fn upper(s: &str, out: &mut StrWriter) -> streamd::Result<()> {
    out.push_ascii_uppercase(s);
    Ok(())
}

streamd::export_map_view!(Str, Str, upper);
