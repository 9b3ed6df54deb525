//! streamd guest SDK for Rust: write a stream operator as a type that
//! implements [`Operator`], export it with [`export_operator!`], and build a
//! `cdylib` for `wasm32-unknown-unknown`. The module speaks the streamd guest
//! ABI v1 (abi/ABI.md in the streamd repository).
//!
//! ```ignore
//! use streamd::{Operator, Record, Result};
//!
//! struct Upper;
//!
//! impl Operator for Upper {
//!     fn process_element(&mut self, rec: &Record, _input: u32) -> Result<()> {
//!         streamd::emit_with(rec.key, rec.timestamp, |v| {
//!             v.extend(rec.value.iter().map(u8::to_ascii_uppercase))
//!         });
//!         Ok(())
//!     }
//! }
//!
//! streamd::export_operator!(Upper, Upper);
//! ```
//!
//! The SDK exports every `streamd_*` function, keeps one input buffer for the
//! host (grown on demand), decodes record batches without allocating per
//! record, buffers emitted records into one output frame per lifecycle call,
//! and turns a panic into a subtask failure whose message holds the panic text
//! and its source location.
//!
//! Everything that reaches the host (emit, state, timers, log, fail) is a Wasm
//! import on wasm32. Built for another target (native `cargo test`), the SDK
//! talks to the simulated host of [`testing`] instead, so operators, windows
//! and codecs are testable without a Wasm runtime (`streamd::testing::Harness`).

#![warn(missing_docs)]

pub mod codec;
mod context;
mod emit;
pub mod frame;
pub mod helpers;
mod keyed;
pub mod list_state;
pub mod log;
pub mod nexmark;
pub mod state;
mod sys;
pub mod typed;
pub mod window;

#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

pub use codec::{Bytes, BytesWriter, Codec, Encoder, Str, StrWriter, ViewCodec, WriteCodec, F64, I64};
pub use context::Context;
pub use emit::{emit, emit_record, emit_to, emit_with, emit_with_headers, flush, ValueWriter, FLUSH_BYTES};
pub use frame::{append_header, Batch, Headers, Record, NO_TIMESTAMP};
pub use helpers::{Collector, Filter, FlatMap, Map, OwnedRecord};
pub use keyed::{current_key, phase, with_key};
pub use list_state::ListMode;
pub use state::{AggregatingState, Aggregator, ListState, MapState, ReducingState, TtlUpdate, ValueState};
pub use typed::{filter_typed, filter_view, flat_map_typed, flat_map_view, map_typed, map_view, process_typed, process_view};
pub use window::{TimeWindow, WindowAssigner, WindowOperator, WindowOutput, Windows};

use core::fmt;

/// The ABI version this SDK implements (`streamd_abi_version`).
pub const ABI_VERSION: i32 = 1;

/// The watermark before the first one arrived.
pub const MIN_WATERMARK: i64 = i64::MIN;

/// The watermark that ends event time: every timer fires before
/// `on_watermark(MAX_WATERMARK)`. Bounded inputs end with it.
pub const MAX_WATERMARK: i64 = i64::MAX;

/// An operator failure. Returning it from a lifecycle method fails the subtask
/// with this message (the SDK passes it to the host's `fail`), except a
/// rejection ([`reject`]) returned from `process_element` / `process_batch`.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    msg: String,
    rejected: bool,
}

/// Rejects the record being processed on purpose: `return Err(streamd::reject("bad value"))`
/// from `process_element` (or `process_batch`). The subtask does not fail and
/// nothing traps: the SDK gives the reason to the host's `reject` import and
/// returns status 3 (REJECT), and the host handles the record as the
/// operator's `on_error` in the job file says (skip, dead_letter, or fail the
/// job with this reason). What the batch emitted and wrote to keyed state is
/// undone: the host replays it without the rejected record. Returned from
/// another method it fails the subtask like any error.
pub fn reject(reason: impl Into<String>) -> Error {
    Error { msg: reason.into(), rejected: true }
}

impl Error {
    /// An error with this message.
    pub fn new(msg: impl Into<String>) -> Error {
        Error { msg: msg.into(), rejected: false }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.msg
    }

    /// Whether it is a rejection made by [`reject`].
    pub fn is_rejection(&self) -> bool {
        self.rejected
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({:?})", self.msg)
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(msg: String) -> Error {
        Error { msg, rejected: false }
    }
}

impl From<&str> for Error {
    fn from(msg: &str) -> Error {
        Error { msg: msg.to_string(), rejected: false }
    }
}

impl From<frame::FrameError> for Error {
    fn from(e: frame::FrameError) -> Error {
        Error { msg: e.to_string(), rejected: false }
    }
}

impl From<core::num::ParseIntError> for Error {
    fn from(e: core::num::ParseIntError) -> Error {
        Error { msg: e.to_string(), rejected: false }
    }
}

impl From<core::str::Utf8Error> for Error {
    fn from(e: core::str::Utf8Error) -> Error {
        Error { msg: e.to_string(), rejected: false }
    }
}

impl From<fmt::Error> for Error {
    fn from(e: fmt::Error) -> Error {
        Error { msg: e.to_string(), rejected: false }
    }
}

/// `Result<T, streamd::Error>`.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// A stream operator: one value per subtask, driven by the host through these
/// methods in this order, never concurrently:
///
/// ```text
/// open                                   once, first
/// ( process_batch / process_element      for each batch / record of each input, in order
/// | on_timer* on_watermark               when the watermark advances
/// | on_processing_time*                  when processing time reaches timers
/// | snapshot_state | notify_checkpoint_complete )*
/// end_input                              once per input, when it ended with drain
/// finish                                 once, after every end_input
/// ( snapshot_state | notify_checkpoint_complete )*   the final checkpoint
/// close                                  last, not after a failure (trap, error, fail)
/// ```
///
/// A method that returns `Err`, or panics, fails the subtask: the error text
/// (or the panic text and location) becomes the host's error message, and the
/// job fails over according to its restart strategy. Every method but
/// `process_element` has a default that does nothing.
pub trait Operator {
    /// Called once before anything else. When `ctx.restored` is true, read
    /// back the operator list state written in `snapshot_state` with
    /// [`list_state::entries`]. May use keyed state and timers; must not emit.
    fn open(&mut self, ctx: &Context) -> Result<()> {
        let _ = ctx;
        Ok(())
    }

    /// Called for every record of input `input` (0-based, the order of the
    /// operator's inputs in the job file). May emit, and use keyed state and
    /// timers of the current key, `rec.key`. `rec`'s slices are valid only
    /// during the call.
    fn process_element(&mut self, rec: &Record<'_>, input: u32) -> Result<()>;

    /// Called for each batch the host passes; the default calls
    /// `process_element` for each record with the record's key as the current
    /// key. Override it to work on whole batches (and use [`with_key`] per
    /// record for keyed state).
    fn process_batch(&mut self, batch: &Batch<'_>, input: u32) -> Result<()> {
        for rec in batch {
            with_key(rec.key, || self.process_element(&rec, input))?;
        }
        Ok(())
    }

    /// Called when the subtask's watermark advances to `ts`, after the timers
    /// it fired. The host forwards watermarks itself. May emit.
    fn on_watermark(&mut self, ts: i64) -> Result<()> {
        let _ = ts;
        Ok(())
    }

    /// Called for each event-time timer with `ts` at or below the new
    /// watermark, in `ts` order (ties in key order), before `on_watermark`.
    /// The timer is already removed. `key` is the current key. May emit.
    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        let _ = (ts, key);
        Ok(())
    }

    /// Called for each processing-time timer when the host's processing time
    /// reaches `ts`, in (`ts`, key) order, between batches. The timer is
    /// already removed. `key` is the current key. May emit. Pending ones do not
    /// fire after `finish`.
    fn on_processing_time(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        let _ = (ts, key);
        Ok(())
    }

    /// Called once per input when it has delivered all its records (end of
    /// data with drain). May emit.
    fn end_input(&mut self, input: u32) -> Result<()> {
        let _ = input;
        Ok(())
    }

    /// Called once after every `end_input`: emit what is still buffered. No
    /// record may be emitted after it returns. A stop with savepoint without
    /// drain calls neither `end_input` nor `finish`.
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }

    /// Called at each checkpoint barrier: write the operator list state to
    /// keep with [`list_state::add`]. Keyed state and timers are snapshotted by
    /// the host. Must not emit.
    fn snapshot_state(&mut self, checkpoint_id: i64) -> Result<()> {
        let _ = checkpoint_id;
        Ok(())
    }

    /// Called when checkpoint `checkpoint_id` is durable. Must not emit.
    fn notify_checkpoint_complete(&mut self, checkpoint_id: i64) -> Result<()> {
        let _ = checkpoint_id;
        Ok(())
    }

    /// Called last, not after a failure (trap, error, fail): release
    /// resources only. Must not emit.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A boxed operator is an operator ([`export_boxed_operator!`] stores one).
impl<T: Operator + ?Sized> Operator for Box<T> {
    fn open(&mut self, ctx: &Context) -> Result<()> {
        (**self).open(ctx)
    }
    fn process_element(&mut self, rec: &Record<'_>, input: u32) -> Result<()> {
        (**self).process_element(rec, input)
    }
    fn process_batch(&mut self, batch: &Batch<'_>, input: u32) -> Result<()> {
        (**self).process_batch(batch, input)
    }
    fn on_watermark(&mut self, ts: i64) -> Result<()> {
        (**self).on_watermark(ts)
    }
    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        (**self).on_timer(ts, key)
    }
    fn on_processing_time(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        (**self).on_processing_time(ts, key)
    }
    fn end_input(&mut self, input: u32) -> Result<()> {
        (**self).end_input(input)
    }
    fn finish(&mut self) -> Result<()> {
        (**self).finish()
    }
    fn snapshot_state(&mut self, checkpoint_id: i64) -> Result<()> {
        (**self).snapshot_state(checkpoint_id)
    }
    fn notify_checkpoint_complete(&mut self, checkpoint_id: i64) -> Result<()> {
        (**self).notify_checkpoint_complete(checkpoint_id)
    }
    fn close(&mut self) -> Result<()> {
        (**self).close()
    }
}

/// Timers of the current key, held by the host and checkpointed with keyed
/// state. A timer fires once; registering the same (key, ts) twice keeps one.
pub mod timer {
    use crate::keyed::with_current;
    use crate::sys;

    /// Registers an event-time timer for the current key at `ts`: it fires
    /// (`on_timer`) when the watermark reaches `ts`. One at or below the
    /// current watermark fires at the next advance; one at
    /// [`crate::MAX_WATERMARK`] at the end of event time.
    pub fn register_event_time(ts: i64) {
        with_current(&"timer", |k| sys::timer_register(k, ts))
    }

    /// Deletes the current key's event-time timer at `ts`, if there is one.
    pub fn delete_event_time(ts: i64) {
        with_current(&"timer", |k| sys::timer_delete(k, ts))
    }

    /// Registers a processing-time timer for the current key at `ts` (ms): it
    /// fires (`on_processing_time`) when the host's processing time reaches it.
    pub fn register_processing_time(ts: i64) {
        with_current(&"processing-time timer", |k| sys::ptimer_register(k, ts))
    }

    /// Deletes the current key's processing-time timer at `ts`, if any.
    pub fn delete_processing_time(ts: i64) {
        with_current(&"processing-time timer", |k| sys::ptimer_delete(k, ts))
    }

    /// Deprecated (explicit key): registers an event-time timer for `key`.
    #[deprecated(note = "timers follow the current key: use register_event_time")]
    pub fn register(key: &[u8], ts: i64) {
        sys::timer_register(key, ts)
    }

    /// Deprecated (explicit key): deletes the event-time timer of `key` at `ts`.
    #[deprecated(note = "timers follow the current key: use delete_event_time")]
    pub fn delete(key: &[u8], ts: i64) {
        sys::timer_delete(key, ts)
    }
}

/// The subtask's current watermark ([`MIN_WATERMARK`] before the first).
pub fn current_watermark() -> i64 {
    sys::current_watermark()
}

/// The host's processing time in ms. Needs `allow_clock: true` in the job
/// file (otherwise the host fails the subtask).
pub fn current_processing_time() -> i64 {
    sys::processing_time()
}

/// Sends watermark `ts` downstream. From the first call on the operator's
/// output watermark is its own: the host stops forwarding its input
/// watermark. A watermark not above the last one emitted is ignored. Allowed
/// in `open`, `process_element`, `on_watermark`, `on_timer`,
/// `on_processing_time` and `end_input`; after all inputs end the host still
/// sends MAX after `finish`.
pub fn emit_watermark(ts: i64) {
    emit::flush(); // records before the watermark stay before it
    sys::emit_watermark(ts)
}

/// The current watermark of input `input` (min over its channels, idle ones
/// excluded), [`MIN_WATERMARK`] before any.
pub fn input_watermark(input: u32) -> i64 {
    sys::input_watermark(input as i32)
}

/// Fails the subtask with `msg` now; never returns.
pub fn fail(msg: &str) -> ! {
    sys::fail(msg)
}

#[doc(hidden)]
pub mod __rt;

#[cfg(test)]
mod harness_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod window_tests;
