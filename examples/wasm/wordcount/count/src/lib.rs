//! wordcount, step 2: counts the occurrences of each word (the record key) in
//! keyed state "count", and emits "word count" once per word at the end of
//! event time.
//!
//! Keyed state cannot be enumerated by the guest, so the first occurrence of a
//! word registers a timer at the MAX watermark for that key; at the end of a
//! bounded input every timer fires and `on_timer` emits the final count. Counts
//! and timers are host-held keyed state, so they survive checkpoints, restores
//! and rescaling.

use std::fmt::Write;
use streamd::{timer, Operator, Record, Result, ValueState, I64, MAX_WATERMARK};

/// Keyed state of the current key (the word): its count, 8 bytes little-endian.
const COUNT: ValueState<I64> = ValueState::new("count");

/// The counter.
pub struct Count;

impl Operator for Count {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        if !rec.has_key() {
            return Err("count: record without a key (the input must be keyed by word)".into());
        }
        let n = COUNT.get().unwrap_or(0);
        if n == 0 {
            timer::register_event_time(MAX_WATERMARK);
        }
        COUNT.set(&(n + 1));
        Ok(())
    }

    fn on_timer(&mut self, _ts: i64, key: &[u8]) -> Result<()> {
        let n = COUNT.get().unwrap_or(0);
        let word = std::str::from_utf8(key)?;
        streamd::emit_with(key, streamd::NO_TIMESTAMP, |v| {
            let _ = write!(v, "{} {}", word, n);
        });
        Ok(())
    }
}

streamd::export_operator!(Count, Count);
