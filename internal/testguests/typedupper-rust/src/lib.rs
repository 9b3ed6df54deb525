//! The ASCII upper-case map of `examples/wasm/uppercase-rust`, written with
//! the typed helpers over the `Str` codec: the typed side of
//! BenchmarkTypedVsRaw (internal/runtime). `map_view` borrows the value as
//! `&str` and writes the result straight into the output frame.

use streamd::{Str, StrWriter};

fn upper(s: &str, out: &mut StrWriter) -> streamd::Result<()> {
    out.push_str(s).make_ascii_uppercase();
    Ok(())
}

streamd::export_map_view!(Str, Str, upper);
