//! Emitting records: they are appended to one output batch frame that the SDK
//! sends with the host's `emit` import at the end of each lifecycle call, or
//! earlier when the frame grows past [`FLUSH_BYTES`].

use crate::codec::BytesWriter;
use crate::frame::Record;
use crate::sys;
use core::cell::RefCell;
use core::fmt;

/// The output frame is sent as soon as it holds this many bytes.
pub const FLUSH_BYTES: usize = 64 * 1024;

struct Out {
    /// The batch frame under construction: a u32 count placeholder, then records.
    buf: Vec<u8>,
    count: u32,
}

thread_local! {
    static OUT: RefCell<Out> = const { RefCell::new(Out { buf: Vec::new(), count: 0 }) };
    /// Side outputs: one frame under construction per output name, sent at
    /// the end of the lifecycle call (or at 64 KiB).
    static SIDE: RefCell<Vec<(String, Vec<u8>, u32)>> = const { RefCell::new(Vec::new()) };
}

/// Emits a record to the operator's side output `output` (Flink's
/// `OutputTag`; letters, digits, `-`, `_`, 1 to 128 characters). A job file
/// input `{from: OP.OUTPUT}` reads it; nobody reading drops it. Allowed where
/// [`emit`] is.
pub fn emit_to(output: &str, key: &[u8], value: &[u8], timestamp: i64) {
    SIDE.with(|s| {
        let mut s = s.borrow_mut();
        let i = match s.iter().position(|(n, _, _)| n == output) {
            Some(i) => i,
            None => {
                let ok = !output.is_empty()
                    && output.len() <= 128
                    && output.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !ok {
                    drop(s);
                    crate::fail(&format!(
                        "emit_to: side output name {:?} is invalid (letters, digits, '-', '_'; 1 to 128)",
                        output
                    ));
                }
                s.push((output.to_string(), Vec::new(), 0));
                s.len() - 1
            }
        };
        let (name, buf, count) = &mut s[i];
        if buf.is_empty() {
            buf.extend_from_slice(&[0, 0, 0, 0]);
        }
        buf.extend_from_slice(&timestamp.to_le_bytes());
        buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
        buf.extend_from_slice(key);
        buf.extend_from_slice(&(value.len() as u32).to_le_bytes());
        buf.extend_from_slice(value);
        *count += 1;
        if buf.len() >= FLUSH_BYTES {
            send_side(name, buf, count);
        }
    })
}

fn send_side(name: &str, buf: &mut Vec<u8>, count: &mut u32) {
    if *count == 0 {
        return;
    }
    buf[..4].copy_from_slice(&count.to_le_bytes());
    sys::emit_to(name.as_bytes(), buf);
    buf.clear();
    *count = 0;
}

impl Out {
    #[inline(always)]
    fn begin(&mut self, extra: usize) {
        if self.buf.is_empty() {
            self.buf.reserve(FLUSH_BYTES + 1024);
            self.buf.extend_from_slice(&[0, 0, 0, 0]);
        }
        self.buf.reserve(extra);
    }

    #[inline(always)]
    fn end(&mut self) {
        self.count += 1;
        if self.buf.len() >= FLUSH_BYTES {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.count == 0 {
            return;
        }
        let c = self.count.to_le_bytes();
        self.buf[..4].copy_from_slice(&c);
        sys::emit(&self.buf);
        self.buf.clear();
        self.count = 0;
    }
}

/// Emits a record downstream. `key` may be empty (no key); `timestamp` may be
/// [`crate::NO_TIMESTAMP`]. Records reach the host in the order they are emitted.
///
/// Allowed in `process_element`, `on_watermark`, `on_timer`, `end_input` and
/// `finish`; the host fails the subtask for an emit anywhere else.
#[inline]
pub fn emit(key: &[u8], value: &[u8], timestamp: i64) {
    OUT.with(|o| {
        let mut o = o.borrow_mut();
        o.begin(16 + key.len() + value.len());
        let b = &mut o.buf;
        b.extend_from_slice(&timestamp.to_le_bytes());
        b.extend_from_slice(&(key.len() as u32).to_le_bytes());
        b.extend_from_slice(key);
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(value);
        o.end();
    })
}

/// Emits `rec` unchanged, its headers included: `emit_record` of an input
/// record, changed or not, keeps its headers.
#[inline]
pub fn emit_record(rec: &Record<'_>) {
    if rec.headers.is_empty() {
        return emit(rec.key, rec.value, rec.timestamp);
    }
    OUT.with(|o| {
        let mut o = o.borrow_mut();
        o.begin(rec.encoded_len());
        crate::frame::encode_record(&mut o.buf, rec);
        o.end();
    })
}

/// Emits a record whose value `write` produces straight into the output
/// frame, without an intermediate buffer:
///
/// ```ignore
/// streamd::emit_with(rec.key, rec.timestamp, |v| v.extend(rec.value.iter().map(u8::to_ascii_uppercase)));
/// streamd::emit_with(word, ts, |v| { let _ = write!(v, "{} {}", w, n); });
/// ```
///
/// `write` must not emit itself (that panics).
#[inline]
pub fn emit_with<F: FnOnce(&mut ValueWriter<'_>)>(key: &[u8], timestamp: i64, write: F) {
    emit_written(key, timestamp, &[], write)
}

/// [`emit_with`] for a record with `headers` (an input record's, to keep
/// them: `emit_with_headers(rec.key, rec.timestamp, rec.headers, |v| ...)`).
#[inline]
pub fn emit_with_headers<F: FnOnce(&mut ValueWriter<'_>)>(key: &[u8], timestamp: i64, headers: crate::Headers<'_>, write: F) {
    emit_written(key, timestamp, headers.as_bytes(), write)
}

/// The record of key, timestamp, the value `write` produces and the header
/// block `headers` (empty: none), framed in place. Inlined into each
/// caller, so `emit_with`'s empty block costs no branch.
#[inline(always)]
fn emit_written<F: FnOnce(&mut ValueWriter<'_>)>(key: &[u8], timestamp: i64, headers: &[u8], write: F) {
    let flag = if headers.is_empty() { 0 } else { crate::frame::HEADERS_FLAG };
    OUT.with(|o| {
        let mut o = o.borrow_mut();
        o.begin(16 + key.len() + if headers.is_empty() { 0 } else { 4 + headers.len() });
        let b = &mut o.buf;
        b.extend_from_slice(&timestamp.to_le_bytes());
        b.extend_from_slice(&(key.len() as u32 | flag).to_le_bytes());
        b.extend_from_slice(key);
        let len_at = b.len();
        b.extend_from_slice(&[0, 0, 0, 0]);
        let start = b.len();
        write(&mut ValueWriter { buf: b });
        let n = (b.len() - start) as u32;
        b[len_at..len_at + 4].copy_from_slice(&n.to_le_bytes());
        if !headers.is_empty() {
            b.extend_from_slice(&(headers.len() as u32).to_le_bytes());
            b.extend_from_slice(headers);
        }
        o.end();
    })
}

/// Sends the buffered records to the host now. The SDK calls it at the end of
/// every lifecycle call; operators rarely need it.
pub fn flush() {
    OUT.with(|o| o.borrow_mut().flush());
    SIDE.with(|s| {
        for (name, buf, count) in s.borrow_mut().iter_mut() {
            send_side(name, buf, count)
        }
    })
}

/// Drops buffered records without sending them.
pub(crate) fn discard() {
    OUT.with(|o| {
        let mut o = o.borrow_mut();
        o.buf.clear();
        o.count = 0;
    });
    SIDE.with(|s| {
        for (_, buf, count) in s.borrow_mut().iter_mut() {
            buf.clear();
            *count = 0;
        }
    })
}

/// Appends the value of a record being emitted with [`emit_with`]. It only
/// appends: what was written before (other records) cannot be touched.
pub struct ValueWriter<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> ValueWriter<'a> {
    /// The output frame to append the value to (a [`crate::Codec`] encodes
    /// into it). Only append: truncating it corrupts the frame.
    #[inline]
    pub(crate) fn vec(&mut self) -> &mut Vec<u8> {
        self.buf
    }
}

/// `write_bytes`, `push`, `reserve` and `append` are [`BytesWriter`]'s.
impl<'a> core::ops::Deref for ValueWriter<'a> {
    type Target = BytesWriter;
    #[inline]
    fn deref(&self) -> &BytesWriter {
        BytesWriter::over_ref(self.buf)
    }
}

impl<'a> core::ops::DerefMut for ValueWriter<'a> {
    #[inline]
    fn deref_mut(&mut self) -> &mut BytesWriter {
        BytesWriter::over(self.buf)
    }
}

impl<'a> Extend<u8> for ValueWriter<'a> {
    #[inline]
    fn extend<I: IntoIterator<Item = u8>>(&mut self, iter: I) {
        self.buf.extend(iter)
    }
}

impl<'a, 'b> Extend<&'b u8> for ValueWriter<'a> {
    #[inline]
    fn extend<I: IntoIterator<Item = &'b u8>>(&mut self, iter: I) {
        self.buf.extend(iter)
    }
}

impl<'a> fmt::Write for ValueWriter<'a> {
    #[inline]
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
}
