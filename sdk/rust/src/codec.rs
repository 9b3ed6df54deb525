//! Codecs: how typed state values, typed helper records and window results
//! become bytes (SPEC14 section 4).

use crate::{Error, Result};

/// Encodes and decodes values of one type. Implement it for your own types
/// (a unit struct is enough): `struct Point; impl Codec for Point { type Item = (i64, i64); ... }`.
pub trait Codec {
    /// The decoded type.
    type Item;
    /// Appends the encoding of `v` to `out`.
    fn encode(v: &Self::Item, out: &mut Vec<u8>);
    /// Decodes a whole value; an error says why it is not one.
    fn decode(b: &[u8]) -> Result<Self::Item>;

    /// Decodes into `buf`'s allocation when the type can (a spare buffer
    /// the typed helpers keep between records); by default [`Codec::decode`].
    #[inline]
    fn decode_reusing(b: &[u8], buf: Vec<u8>) -> Result<Self::Item> {
        let _ = buf;
        Self::decode(b)
    }

    /// Gives back the allocation of a value that is done with, for the next
    /// [`Codec::decode_reusing`]; by default none.
    #[inline]
    fn recycle(v: Self::Item) -> Option<Vec<u8>> {
        let _ = v;
        None
    }
}

/// Raw bytes, unchanged (`Vec<u8>`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Bytes;

impl Codec for Bytes {
    type Item = Vec<u8>;
    #[inline]
    fn encode(v: &Vec<u8>, out: &mut Vec<u8>) {
        out.extend_from_slice(v)
    }
    #[inline]
    fn decode(b: &[u8]) -> Result<Vec<u8>> {
        Ok(b.to_vec())
    }
    #[inline]
    fn decode_reusing(b: &[u8], mut buf: Vec<u8>) -> Result<Vec<u8>> {
        buf.clear();
        buf.extend_from_slice(b);
        Ok(buf)
    }
    #[inline]
    fn recycle(v: Vec<u8>) -> Option<Vec<u8>> {
        Some(v)
    }
}

/// UTF-8 text (`String`); decoding fails on invalid UTF-8.
#[derive(Clone, Copy, Debug, Default)]
pub struct Str;

impl Codec for Str {
    type Item = String;
    #[inline]
    fn encode(v: &String, out: &mut Vec<u8>) {
        out.extend_from_slice(v.as_bytes())
    }
    #[inline]
    fn decode(b: &[u8]) -> Result<String> {
        check_utf8(b)?;
        // Valid UTF-8: checked above.
        Ok(unsafe { String::from_utf8_unchecked(b.to_vec()) })
    }
    #[inline]
    fn decode_reusing(b: &[u8], mut buf: Vec<u8>) -> Result<String> {
        check_utf8(b)?;
        buf.clear();
        buf.extend_from_slice(b);
        // Valid UTF-8: checked above.
        Ok(unsafe { String::from_utf8_unchecked(buf) })
    }
    #[inline]
    fn recycle(v: String) -> Option<Vec<u8>> {
        Some(v.into_bytes())
    }
}

/// Checks UTF-8 with a fast path for ASCII: an OR over the bytes, which
/// LLVM vectorizes (with `simd128`, 16 bytes an instruction); core's
/// validator decides only when a byte is not ASCII.
#[inline]
pub fn check_utf8(b: &[u8]) -> Result<()> {
    if b.iter().fold(0u8, |a, &c| a | c) < 0x80 {
        return Ok(());
    }
    match core::str::from_utf8(b) {
        Ok(_) => Ok(()),
        Err(e) => Err(Error::new(format!("not UTF-8: invalid byte at {}", e.valid_up_to()))),
    }
}

/// A signed 64-bit integer, 8 bytes little-endian (the layout of the
/// deprecated `ValueState::get_u64`/`put_u64`, so old counts read back).
#[derive(Clone, Copy, Debug, Default)]
pub struct I64;

impl Codec for I64 {
    type Item = i64;
    #[inline]
    fn encode(v: &i64, out: &mut Vec<u8>) {
        out.extend_from_slice(&v.to_le_bytes())
    }
    #[inline]
    fn decode(b: &[u8]) -> Result<i64> {
        Ok(i64::from_le_bytes(fixed8(b, "i64")?))
    }
}

/// A 64-bit float, its IEEE 754 bits as 8 bytes little-endian.
#[derive(Clone, Copy, Debug, Default)]
pub struct F64;

impl Codec for F64 {
    type Item = f64;
    #[inline]
    fn encode(v: &f64, out: &mut Vec<u8>) {
        out.extend_from_slice(&v.to_bits().to_le_bytes())
    }
    #[inline]
    fn decode(b: &[u8]) -> Result<f64> {
        Ok(f64::from_bits(u64::from_le_bytes(fixed8(b, "f64")?)))
    }
}

fn fixed8(b: &[u8], what: &str) -> Result<[u8; 8]> {
    if b.len() != 8 {
        return Err(Error::new(format!("{} bytes, want 8 (little-endian {})", b.len(), what)));
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Ok(a)
}

/// Encodes `v` into a new vector.
pub fn encode_to_vec<C: Codec>(v: &C::Item) -> Vec<u8> {
    let mut out = Vec::new();
    C::encode(v, &mut out);
    out
}
