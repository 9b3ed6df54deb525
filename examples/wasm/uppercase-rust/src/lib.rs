//! Upper-cases the ASCII letters of each record's value; key, timestamp and
//! headers pass through. The Rust twin of the Go `uppercase` example, for comparing
//! guest languages (and native Go) in benchmarks.

use streamd::{Operator, Record, Result};

/// The stateless map.
pub struct Uppercase;

impl Operator for Uppercase {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        // Written straight into the output frame: no allocation per record.
        streamd::emit_with_headers(rec.key, rec.timestamp, rec.headers, |v| v.extend(rec.value.iter().map(u8::to_ascii_uppercase)));
        Ok(())
    }
}

streamd::export_operator!(Uppercase, Uppercase);
