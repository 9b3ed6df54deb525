//! Stateless operators from plain functions: [`Map`], [`Filter`] and
//! [`FlatMap`], the Rust counterparts of the Go SDK's `streamd.Map`,
//! `streamd.Filter` and `streamd.FlatMap`. Export one with
//! [`export_map!`](crate::export_map), [`export_filter!`](crate::export_filter)
//! or [`export_flat_map!`](crate::export_flat_map).
//!
//! ```ignore
//! fn shout(r: &streamd::Record) -> streamd::OwnedRecord {
//!     streamd::OwnedRecord { key: r.key.to_vec(), value: r.value.to_ascii_uppercase(), timestamp: r.timestamp, ..Default::default() }
//! }
//! streamd::export_map!(shout);
//! ```
//!
//! A [`Map`] function returns an [`OwnedRecord`], which owns its key and
//! value: it costs the allocations the function makes (each about a fifth of
//! the hand-written map's time per 100-byte record in wazero; build the value
//! in one, as above, not by copying a temporary with `OwnedRecord::new`). A
//! map that must be fast writes into the output frame instead:
//! [`emit_with`](crate::emit_with) or [`map_view`](crate::map_view).

use crate::{emit, Operator, Record, Result};

/// A record that owns its key, value and headers, returned by [`Map`]
/// functions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedRecord {
    /// The key; empty means no key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// Event time in ms, or [`NO_TIMESTAMP`](crate::NO_TIMESTAMP).
    pub timestamp: i64,
    /// The header block ([`Headers`](crate::Headers), built with
    /// [`append_header`](crate::append_header)); empty: none.
    pub headers: Vec<u8>,
}

impl OwnedRecord {
    /// A record with copies of `key` and `value`, without headers.
    pub fn new(key: &[u8], value: &[u8], timestamp: i64) -> OwnedRecord {
        OwnedRecord { key: key.to_vec(), value: value.to_vec(), timestamp, headers: Vec::new() }
    }

    /// The record as a [`Record`] borrowing it. Its headers are emitted
    /// as they are: a malformed block fails the subtask at the host.
    pub fn as_record(&self) -> Record<'_> {
        Record::new(&self.key, &self.value, self.timestamp).with_headers(crate::frame::Headers::unchecked(&self.headers))
    }
}

/// Emits `f(record)` for every record.
pub struct Map<F>(pub F);

impl<F: FnMut(&Record<'_>) -> OwnedRecord> Operator for Map<F> {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let out = (self.0)(rec);
        if out.headers.is_empty() {
            emit(&out.key, &out.value, out.timestamp);
        } else {
            crate::emit_record(&out.as_record());
        }
        Ok(())
    }
}

/// Emits the records for which `f` returns true, unchanged.
pub struct Filter<F>(pub F);

impl<F: FnMut(&Record<'_>) -> bool> Operator for Filter<F> {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        if (self.0)(rec) {
            crate::emit_record(rec);
        }
        Ok(())
    }
}

/// Calls `f(record, collector)` for every record; `f` emits any number of
/// records through the [`Collector`].
pub struct FlatMap<F>(pub F);

/// Where a [`FlatMap`] function emits its records.
pub struct Collector {
    _private: (),
}

impl Collector {
    /// Emits a record downstream.
    pub fn emit(&mut self, key: &[u8], value: &[u8], timestamp: i64) {
        emit(key, value, timestamp)
    }
}

impl<F: FnMut(&Record<'_>, &mut Collector)> Operator for FlatMap<F> {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        (self.0)(rec, &mut Collector { _private: () });
        Ok(())
    }
}

/// The function-pointer types the export macros name.
pub type MapFn = for<'a, 'b> fn(&'a Record<'b>) -> OwnedRecord;
/// See [`MapFn`].
pub type FilterFn = for<'a, 'b> fn(&'a Record<'b>) -> bool;
/// See [`MapFn`].
pub type FlatMapFn = for<'a, 'b, 'c> fn(&'a Record<'b>, &'c mut Collector);

/// Exports a stateless map: `fn(&Record) -> OwnedRecord`.
#[macro_export]
macro_rules! export_map {
    ($f:path) => {
        $crate::export_operator!($crate::Map<$crate::helpers::MapFn>, $crate::Map($f as $crate::helpers::MapFn));
    };
}

/// Exports a stateless filter: `fn(&Record) -> bool`.
#[macro_export]
macro_rules! export_filter {
    ($f:path) => {
        $crate::export_operator!($crate::Filter<$crate::helpers::FilterFn>, $crate::Filter($f as $crate::helpers::FilterFn));
    };
}

/// Exports a stateless flat map: `fn(&Record, &mut Collector)`.
#[macro_export]
macro_rules! export_flat_map {
    ($f:path) => {
        $crate::export_operator!($crate::FlatMap<$crate::helpers::FlatMapFn>, $crate::FlatMap($f as $crate::helpers::FlatMapFn));
    };
}
