//! wordcount, step 1: splits each line (the record value) into words and emits
//! one record per word, keyed by the lowercase word, so that a hash edge sends
//! every occurrence of a word to the same `count` subtask.
//!
//! A word is a maximal run of ASCII letters and digits. Words shorter than the
//! config value `min_length` (default 1) are skipped. The value of each emitted
//! record is empty; the timestamp is the line's.

use streamd::{Context, Operator, Record, Result};

/// The splitter.
pub struct Split {
    min_length: usize,
    word: Vec<u8>,
}

impl Operator for Split {
    fn open(&mut self, ctx: &Context) -> Result<()> {
        self.min_length = ctx.config_u64_or("min_length", 1)? as usize;
        Ok(())
    }

    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        for w in rec.value.split(|b| !b.is_ascii_alphanumeric()) {
            if w.is_empty() || w.len() < self.min_length {
                continue;
            }
            self.word.clear();
            self.word.extend(w.iter().map(u8::to_ascii_lowercase));
            streamd::emit(&self.word, b"", rec.timestamp);
        }
        Ok(())
    }
}

streamd::export_operator!(Split, Split { min_length: 1, word: Vec::with_capacity(64) });
