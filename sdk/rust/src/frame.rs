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

/// Set in a record's key length: a header block follows its value (u32
/// length, then the entries; abi/ABI.md, "Record headers").
pub const HEADERS_FLAG: u32 = 1 << 31;

/// A record's headers: entries of a name and a value, in order, a name
/// possibly repeated (a Kafka record's headers, for one), in the frame's
/// encoding. Those of an input record borrow the SDK's input buffer.
/// Build a block with [`append_header`]:
///
/// ```ignore
/// let mut h = Vec::new();
/// streamd::append_header(&mut h, b"trace-id", id);
/// streamd::emit_record(&Record::new(key, value, ts).with_headers(Headers::new(&h)?));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Headers<'a>(&'a [u8]);

impl<'a> Headers<'a> {
    /// No headers.
    pub const EMPTY: Headers<'static> = Headers(&[]);

    /// The headers encoded in `block`, which must be whole entries.
    pub fn new(block: &'a [u8]) -> Result<Headers<'a>, FrameError> {
        let mut it = HeaderIter { b: block, off: 0 };
        while it.off < block.len() {
            if it.next().is_none() {
                return Err(FrameError::LengthOutOfBounds { at: it.off, what: "header", len: block.len() as u32 });
            }
        }
        Ok(Headers(block))
    }

    /// `block` taken as it is; what reads it stops at a bad entry.
    pub(crate) const fn unchecked(block: &'a [u8]) -> Headers<'a> {
        Headers(block)
    }

    /// The encoded block.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }

    /// Whether there is no header.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The number of headers.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// The headers in order, as (name, value).
    pub fn iter(&self) -> HeaderIter<'a> {
        HeaderIter { b: self.0, off: 0 }
    }

    /// The value of the first header called `name`.
    pub fn get(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Iterator over [`Headers`], yielding (name, value).
#[derive(Clone, Debug)]
pub struct HeaderIter<'a> {
    b: &'a [u8],
    off: usize,
}

impl<'a> Iterator for HeaderIter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<(&'a [u8], &'a [u8])> {
        let b = self.b;
        let mut off = self.off;
        if b.len() - off < 4 {
            return None;
        }
        let nl = u32_at(b, off) as usize;
        off += 4;
        if nl > b.len() - off || b.len() - off - nl < 4 {
            return None;
        }
        let name = &b[off..off + nl];
        off += nl;
        let vl = u32_at(b, off) as usize;
        off += 4;
        if vl > b.len() - off {
            return None;
        }
        self.off = off + vl;
        Some((name, &b[off..off + vl]))
    }
}

/// Appends the header `name`: `value` to the header block `dst`.
pub fn append_header(dst: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    dst.extend_from_slice(&(name.len() as u32).to_le_bytes());
    dst.extend_from_slice(name);
    dst.extend_from_slice(&(value.len() as u32).to_le_bytes());
    dst.extend_from_slice(value);
}

/// One stream element. `key` is empty when the record has no key; `timestamp`
/// is event time in milliseconds since the Unix epoch, or [`NO_TIMESTAMP`];
/// `headers` are its headers (none: empty).
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
    /// The record's headers.
    pub headers: Headers<'a>,
}

impl<'a> Record<'a> {
    /// A record with key, value and timestamp, and no headers.
    pub const fn new(key: &'a [u8], value: &'a [u8], timestamp: i64) -> Self {
        Record { key, value, timestamp, headers: Headers(&[]) }
    }

    /// The record with `headers`.
    pub const fn with_headers(self, headers: Headers<'a>) -> Self {
        Record { headers, ..self }
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
        let n = RECORD_HEADER + self.key.len() + self.value.len();
        if self.headers.is_empty() {
            n
        } else {
            n + 4 + self.headers.0.len()
        }
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
/// u32 key_len, key, u32 value_len, value`, and `u32 headers_len, headers`
/// when key_len has [`HEADERS_FLAG`].
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
            let klf = u32_at(data, off + 8);
            let kl = klf & !HEADERS_FLAG;
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
            if klf & HEADERS_FLAG != 0 {
                if data.len() - off < 4 {
                    return Err(FrameError::Truncated { at: off, what: "headers length" });
                }
                let hl = u32_at(data, off);
                off += 4;
                if hl as usize > data.len() - off {
                    return Err(FrameError::LengthOutOfBounds { at: off, what: "headers", len: hl });
                }
                Headers::new(&data[off..off + hl as usize]).map_err(|_| FrameError::LengthOutOfBounds { at: off, what: "header", len: hl })?;
                off += hl as usize;
            }
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
        let klf = u32_at(d, off + 8);
        let kl = (klf & !HEADERS_FLAG) as usize;
        off += 12;
        let key = &d[off..off + kl];
        off += kl;
        let vl = u32_at(d, off) as usize;
        off += 4;
        let value = &d[off..off + vl];
        off += vl;
        let mut headers = Headers(&[]);
        if klf & HEADERS_FLAG != 0 {
            let hl = u32_at(d, off) as usize;
            off += 4;
            headers = Headers(&d[off..off + hl]);
            off += hl;
        }
        self.off = off;
        Some(Record { key, value, timestamp, headers })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl<'a> ExactSizeIterator for BatchIter<'a> {}

/// Appends one record (without the batch count) to `dst`.
pub fn encode_record(dst: &mut Vec<u8>, rec: &Record<'_>) {
    dst.reserve(rec.encoded_len());
    let h = rec.headers.as_bytes();
    let flag = if h.is_empty() { 0 } else { HEADERS_FLAG };
    dst.extend_from_slice(&rec.timestamp.to_le_bytes());
    dst.extend_from_slice(&(rec.key.len() as u32 | flag).to_le_bytes());
    dst.extend_from_slice(rec.key);
    dst.extend_from_slice(&(rec.value.len() as u32).to_le_bytes());
    dst.extend_from_slice(rec.value);
    if !h.is_empty() {
        dst.extend_from_slice(&(h.len() as u32).to_le_bytes());
        dst.extend_from_slice(h);
    }
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

/// Decodes a whole batch frame into owned `(key, value, timestamp)` triples
/// (without headers: [`decode_records_owned`] has them); for tests and
/// tools, not for the hot path.
pub fn decode_batch_owned(data: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>, i64)>, FrameError> {
    let b = Batch::parse(data)?;
    Ok(b.iter().map(|r| (r.key.to_vec(), r.value.to_vec(), r.timestamp)).collect())
}

/// Decodes a whole batch frame into [`OwnedRecord`](crate::OwnedRecord)s,
/// headers included; for tests and tools, not for the hot path.
pub fn decode_records_owned(data: &[u8]) -> Result<Vec<crate::OwnedRecord>, FrameError> {
    let b = Batch::parse(data)?;
    Ok(b.iter()
        .map(|r| crate::OwnedRecord {
            key: r.key.to_vec(),
            value: r.value.to_vec(),
            timestamp: r.timestamp,
            headers: r.headers.as_bytes().to_vec(),
        })
        .collect())
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
