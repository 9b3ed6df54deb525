//! The binary frames of ABI v1 (abi/ABI.md, "Frames"): record batches and the
//! open context. All integers are little-endian, with no padding.
//!
//! Decoding never allocates per record: a [`Batch`] is validated once and then
//! iterated as [`Record`]s whose key and value borrow the frame.

use core::fmt;

/// The timestamp of a record that has no event time.
pub const NO_TIMESTAMP: i64 = i64::MIN;

/// Bytes of a record in a batch besides its key and value: i64 timestamp,
/// u32 key length, u32 value length.
pub const RECORD_HEADER: usize = 16;

/// One stream element. `key` is empty when the record has no key; `timestamp`
/// is event time in milliseconds since the Unix epoch, or [`NO_TIMESTAMP`].
///
/// The slices of a record passed to `process_element` point into the SDK's
/// input buffer and are valid only during that call: copy what must outlive it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The record's key, empty when it has none.
    pub key: &'a [u8],
    /// The record's value.
    pub value: &'a [u8],
    /// Event time in ms since the Unix epoch, or [`NO_TIMESTAMP`].
    pub timestamp: i64,
}

impl<'a> Record<'a> {
    /// A record with key, value and timestamp.
    pub const fn new(key: &'a [u8], value: &'a [u8], timestamp: i64) -> Self {
        Record { key, value, timestamp }
    }

    /// Whether the record carries a key.
    pub fn has_key(&self) -> bool {
        !self.key.is_empty()
    }

    /// Whether the record carries an event time.
    pub fn has_timestamp(&self) -> bool {
        self.timestamp != NO_TIMESTAMP
    }

    /// Its encoded size inside a batch frame.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER + self.key.len() + self.value.len()
    }
}

/// Why a frame could not be decoded. The offsets are byte offsets into the frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The frame ends inside a fixed-size field that starts at `at`.
    Truncated {
        /// Offset of the field.
        at: usize,
        /// What was being read.
        what: &'static str,
    },
    /// A length field at `at` runs past the end of the frame.
    LengthOutOfBounds {
        /// Offset of the data the length describes.
        at: usize,
        /// What was being read.
        what: &'static str,
        /// The length read.
        len: u32,
    },
    /// The batch claims more records than its bytes can hold.
    CountTooLarge {
        /// The record count read.
        count: u32,
        /// The frame's size.
        len: usize,
    },
    /// Bytes are left after the last record (or the last context field).
    Trailing {
        /// How many.
        bytes: usize,
    },
    /// The open context names another ABI version.
    Version {
        /// The version found.
        got: u32,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated { at, what } => write!(f, "malformed frame: {} truncated at byte {}", what, at),
            FrameError::LengthOutOfBounds { at, what, len } => {
                write!(f, "malformed frame: {} of {} bytes at byte {} runs past the frame", what, len, at)
            }
            FrameError::CountTooLarge { count, len } => {
                write!(f, "malformed frame: batch says {} records but has only {} bytes", count, len)
            }
            FrameError::Trailing { bytes } => write!(f, "malformed frame: {} trailing bytes", bytes),
            FrameError::Version { got } => write!(f, "malformed frame: open context has ABI version {}, want 1", got),
        }
    }
}

impl std::error::Error for FrameError {}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_le_bytes(a)
}

/// A validated batch frame: `u32 count`, then per record `i64 timestamp,
/// u32 key_len, key, u32 value_len, value`.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    data: &'a [u8],
    count: u32,
}

impl<'a> Batch<'a> {
    /// Validates `data` as a batch frame: every length must stay inside the
    /// frame and no byte may follow the last record.
    pub fn parse(data: &'a [u8]) -> Result<Batch<'a>, FrameError> {
        if data.len() < 4 {
            return Err(FrameError::Truncated { at: 0, what: "record count" });
        }
        let count = u32_at(data, 0);
        if (count as u64) * (RECORD_HEADER as u64) > (data.len() - 4) as u64 {
            return Err(FrameError::CountTooLarge { count, len: data.len() });
        }
        let mut off = 4usize;
        for _ in 0..count {
            if data.len() - off < RECORD_HEADER {
                return Err(FrameError::Truncated { at: off, what: "record header" });
            }
            let kl = u32_at(data, off + 8);
            off += 12;
            if kl as usize > data.len() - off - 4 {
                return Err(FrameError::LengthOutOfBounds { at: off, what: "key", len: kl });
            }
            off += kl as usize;
            let vl = u32_at(data, off);
            off += 4;
            if vl as usize > data.len() - off {
                return Err(FrameError::LengthOutOfBounds { at: off, what: "value", len: vl });
            }
            off += vl as usize;
        }
        if off != data.len() {
            return Err(FrameError::Trailing { bytes: data.len() - off });
        }
        Ok(Batch { data, count })
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The frame's bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.data
    }

    /// The records in order; their slices borrow the frame.
    pub fn iter(&self) -> BatchIter<'a> {
        BatchIter { data: self.data, off: 4, left: self.count }
    }
}

impl<'a, 'b> IntoIterator for &'b Batch<'a> {
    type Item = Record<'a>;
    type IntoIter = BatchIter<'a>;
    fn into_iter(self) -> BatchIter<'a> {
        self.iter()
    }
}

/// Iterator over the records of a validated [`Batch`].
#[derive(Clone, Debug)]
pub struct BatchIter<'a> {
    data: &'a [u8],
    off: usize,
    left: u32,
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = Record<'a>;

    #[inline]
    fn next(&mut self) -> Option<Record<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let d = self.data;
        let mut off = self.off;
        let timestamp = i64_at(d, off);
        let kl = u32_at(d, off + 8) as usize;
        off += 12;
        let key = &d[off..off + kl];
        off += kl;
        let vl = u32_at(d, off) as usize;
        off += 4;
        let value = &d[off..off + vl];
        self.off = off + vl;
        Some(Record { key, value, timestamp })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl<'a> ExactSizeIterator for BatchIter<'a> {}

/// Appends one record (without the batch count) to `dst`.
pub fn encode_record(dst: &mut Vec<u8>, rec: &Record<'_>) {
    dst.reserve(rec.encoded_len());
    dst.extend_from_slice(&rec.timestamp.to_le_bytes());
    dst.extend_from_slice(&(rec.key.len() as u32).to_le_bytes());
    dst.extend_from_slice(rec.key);
    dst.extend_from_slice(&(rec.value.len() as u32).to_le_bytes());
    dst.extend_from_slice(rec.value);
}

/// Encodes `recs` as a batch frame.
pub fn encode_batch(recs: &[Record<'_>]) -> Vec<u8> {
    let mut dst = Vec::with_capacity(4 + recs.iter().map(Record::encoded_len).sum::<usize>());
    dst.extend_from_slice(&(recs.len() as u32).to_le_bytes());
    for r in recs {
        encode_record(&mut dst, r);
    }
    dst
}

/// Decodes a whole batch frame into owned `(key, value, timestamp)` triples;
/// for tests and tools, not for the hot path.
pub fn decode_batch_owned(data: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>, i64)>, FrameError> {
    let b = Batch::parse(data)?;
    Ok(b.iter().map(|r| (r.key.to_vec(), r.value.to_vec(), r.timestamp)).collect())
}

pub(crate) struct Reader<'a> {
    pub b: &'a [u8],
    pub off: usize,
}

impl<'a> Reader<'a> {
    pub fn u32(&mut self, what: &'static str) -> Result<u32, FrameError> {
        if self.b.len() - self.off < 4 {
            return Err(FrameError::Truncated { at: self.off, what });
        }
        let v = u32_at(self.b, self.off);
        self.off += 4;
        Ok(v)
    }

    pub fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], FrameError> {
        let n = self.u32(what)?;
        if n as usize > self.b.len() - self.off {
            return Err(FrameError::LengthOutOfBounds { at: self.off, what, len: n });
        }
        let s = &self.b[self.off..self.off + n as usize];
        self.off += n as usize;
        Ok(s)
    }

    pub fn string(&mut self, what: &'static str) -> Result<String, FrameError> {
        Ok(String::from_utf8_lossy(self.bytes(what)?).into_owned())
    }
}
