//! The ASCII upper-case map of `examples/wasm/uppercase-rust` with
//! `map_typed::<Str, Str>` over owned `String`s, upper-cased in place (the
//! helper decodes into, and takes back, one spare allocation): the owned
//! typed side of BenchmarkTypedVsRaw (internal/runtime).

fn upper(mut s: String) -> streamd::Result<String> {
    s.make_ascii_uppercase();
    Ok(s)
}

streamd::export_map_typed!(streamd::Str, streamd::Str, upper);
