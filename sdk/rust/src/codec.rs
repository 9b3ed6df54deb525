//! Codecs: how typed state values, typed helper records and window results
//! become bytes (SPEC14 section 4).

use crate::{Error, Result};
use core::fmt;
use core::marker::PhantomData;

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

/// Checks UTF-8 with a fast path for ASCII ([`is_ascii`]); core's validator
/// decides only when a byte is not ASCII.
#[inline]
pub fn check_utf8(b: &[u8]) -> Result<()> {
    if is_ascii(b) {
        return Ok(());
    }
    match core::str::from_utf8(b) {
        Ok(_) => Ok(()),
        Err(e) => Err(Error::new(format!("not UTF-8: invalid byte at {}", e.valid_up_to()))),
    }
}

/// Whether every byte of `b` is below 0x80. It ORs 16-byte lanes together,
/// two a turn, the last lane overlapping the one before (no byte-wise
/// tail): in wazero's code every loop turn costs, and a byte-wise fold took
/// as long as an uppercase map of the same bytes (~20 ns for 100 bytes, 3 ns
/// this way, with `simd128`).
#[inline]
pub fn is_ascii(b: &[u8]) -> bool {
    let n = b.len();
    if n < 16 {
        if n >= 8 {
            return (load8(b, 0) | load8(b, n - 8)) & 0x8080_8080_8080_8080 == 0;
        }
        return b.iter().fold(0u8, |a, &c| a | c) < 0x80;
    }
    // In bounds: 0 <= i, i + 16 <= n for every lane read.
    let mut acc = Lane::load(b, n - 16);
    let mut i = 0;
    while i + 32 <= n {
        acc = acc.or(Lane::load(b, i).or(Lane::load(b, i + 16)));
        i += 32;
    }
    if i + 16 <= n {
        acc = acc.or(Lane::load(b, i));
    }
    acc.is_ascii()
}

#[inline(always)]
fn load8(b: &[u8], i: usize) -> u64 {
    debug_assert!(i + 8 <= b.len());
    // In bounds: the callers read at most up to b.len().
    unsafe { (b.as_ptr().add(i) as *const u64).read_unaligned() }
}

/// 16 bytes: one v128 with `simd128`, two u64 elsewhere (same algorithm, so
/// the native tests cover its indexing).
#[derive(Clone, Copy)]
struct Lane(
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))] core::arch::wasm32::v128,
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))] (u64, u64),
);

impl Lane {
    #[inline(always)]
    fn load(b: &[u8], i: usize) -> Lane {
        debug_assert!(i + 16 <= b.len());
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        // In bounds (see is_ascii); v128_load has no alignment requirement.
        return Lane(unsafe { core::arch::wasm32::v128_load(b.as_ptr().add(i) as *const core::arch::wasm32::v128) });
        #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
        return Lane((load8(b, i), load8(b, i + 8)));
    }

    #[inline(always)]
    fn or(self, o: Lane) -> Lane {
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        return Lane(core::arch::wasm32::v128_or(self.0, o.0));
        #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
        return Lane((self.0 .0 | o.0 .0, self.0 .1 | o.0 .1));
    }

    #[inline(always)]
    fn is_ascii(self) -> bool {
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        return core::arch::wasm32::u8x16_bitmask(self.0) == 0;
        #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
        return (self.0 .0 | self.0 .1) & 0x8080_8080_8080_8080 == 0;
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

/// A codec whose values the `*_view` helpers ([`crate::map_view`],
/// [`crate::filter_view`]) read in place: the value is lent to the function
/// as `&Self::View`, borrowed from the record's bytes where the type allows
/// (`Str`: `&str`, `Bytes`: `&[u8]`), so nothing is copied or allocated.
///
/// A codec of your own without a borrowed form decodes and lends the value:
/// `type View = Self::Item; fn with_view<R>(b: &[u8], f: impl FnOnce(&Self::Item) -> R) -> Result<R> { Ok(f(&Self::decode(b)?)) }`.
pub trait ViewCodec: Codec {
    /// What the function sees (behind a reference).
    type View: ?Sized;
    /// Calls `f` with the value that `b` encodes; an error (before `f` is
    /// called) says why `b` is not one.
    fn with_view<R>(b: &[u8], f: impl FnOnce(&Self::View) -> R) -> Result<R>;
}

/// A codec whose values the `*_view` helpers write straight into the output
/// frame: the function gets `&mut Self::Writer`, which appends to the record
/// being emitted. `Str` has [`StrWriter`], `Bytes` [`BytesWriter`], and
/// `I64`, `F64` (and codecs of your own: `type Writer = Encoder<Self>;`)
/// [`Encoder`].
pub trait WriteCodec: Codec {
    /// What the function writes to.
    type Writer: ?Sized;
    /// The writer over `out`, the output frame after the record's value
    /// length (it may only be appended to).
    fn writer(out: &mut Vec<u8>) -> &mut Self::Writer;
}

impl ViewCodec for Bytes {
    type View = [u8];
    #[inline]
    fn with_view<R>(b: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        Ok(f(b))
    }
}

impl ViewCodec for Str {
    type View = str;
    #[inline]
    fn with_view<R>(b: &[u8], f: impl FnOnce(&str) -> R) -> Result<R> {
        check_utf8(b)?;
        // Valid UTF-8: checked above.
        Ok(f(unsafe { core::str::from_utf8_unchecked(b) }))
    }
}

impl ViewCodec for I64 {
    type View = i64;
    #[inline]
    fn with_view<R>(b: &[u8], f: impl FnOnce(&i64) -> R) -> Result<R> {
        Ok(f(&Self::decode(b)?))
    }
}

impl ViewCodec for F64 {
    type View = f64;
    #[inline]
    fn with_view<R>(b: &[u8], f: impl FnOnce(&f64) -> R) -> Result<R> {
        Ok(f(&Self::decode(b)?))
    }
}

impl WriteCodec for Bytes {
    type Writer = BytesWriter;
    #[inline]
    fn writer(out: &mut Vec<u8>) -> &mut BytesWriter {
        BytesWriter::over(out)
    }
}

impl WriteCodec for Str {
    type Writer = StrWriter;
    #[inline]
    fn writer(out: &mut Vec<u8>) -> &mut StrWriter {
        // StrWriter is a transparent Vec<u8> that appends only whole `str`s,
        // so the value it writes is UTF-8.
        unsafe { &mut *(out as *mut Vec<u8> as *mut StrWriter) }
    }
}

impl WriteCodec for I64 {
    type Writer = Encoder<I64>;
    #[inline]
    fn writer(out: &mut Vec<u8>) -> &mut Encoder<I64> {
        Encoder::over(out)
    }
}

impl WriteCodec for F64 {
    type Writer = Encoder<F64>;
    #[inline]
    fn writer(out: &mut Vec<u8>) -> &mut Encoder<F64> {
        Encoder::over(out)
    }
}

/// Writes a [`Str`] value into the output frame (see [`WriteCodec`]): only
/// whole `str`s and `char`s, so the value stays UTF-8.
#[repr(transparent)]
pub struct StrWriter {
    buf: Vec<u8>,
}

impl StrWriter {
    /// Appends `s` and returns the appended copy, to change in place:
    /// `out.push_str(s).make_ascii_uppercase()`.
    #[inline]
    pub fn push_str(&mut self, s: &str) -> &mut str {
        let at = self.buf.len();
        self.buf.extend_from_slice(s.as_bytes());
        // The bytes from `at` on are a copy of `s`.
        unsafe { core::str::from_utf8_unchecked_mut(&mut self.buf[at..]) }
    }

    /// Appends `s` with its ASCII letters upper-cased, in one pass (as
    /// `str::to_ascii_uppercase`; twice as fast in wazero as
    /// `push_str(s).make_ascii_uppercase()`).
    #[inline]
    pub fn push_ascii_uppercase(&mut self, s: &str) {
        // to_ascii_uppercase keeps every byte >= 0x80: still UTF-8.
        self.buf.extend(s.bytes().map(|b| b.to_ascii_uppercase()))
    }

    /// Appends `s` with its ASCII letters lower-cased, in one pass.
    #[inline]
    pub fn push_ascii_lowercase(&mut self, s: &str) {
        self.buf.extend(s.bytes().map(|b| b.to_ascii_lowercase()))
    }

    /// Appends one character.
    #[inline]
    pub fn push(&mut self, c: char) {
        let mut b = [0u8; 4];
        self.buf.extend_from_slice(c.encode_utf8(&mut b).as_bytes())
    }

    /// Reserves room for `n` more bytes.
    #[inline]
    pub fn reserve(&mut self, n: usize) {
        self.buf.reserve(n)
    }

    /// The output frame itself, to append bytes in one pass
    /// (`v.extend(s.bytes().map(|b| b.to_ascii_uppercase()))`), as
    /// `String::as_mut_vec`.
    ///
    /// # Safety
    /// Only append, and only so that what is appended is UTF-8: the bytes
    /// before are other records of the frame.
    #[inline]
    pub unsafe fn as_mut_vec(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }
}

impl fmt::Write for StrWriter {
    #[inline]
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

impl Extend<char> for StrWriter {
    #[inline]
    fn extend<T: IntoIterator<Item = char>>(&mut self, iter: T) {
        for c in iter {
            self.push(c)
        }
    }
}

/// Writes a [`Bytes`] value into the output frame (see [`WriteCodec`]).
#[repr(transparent)]
pub struct BytesWriter {
    buf: Vec<u8>,
}

impl BytesWriter {
    #[inline]
    pub(crate) fn over(out: &mut Vec<u8>) -> &mut BytesWriter {
        // repr(transparent) over Vec<u8>.
        unsafe { &mut *(out as *mut Vec<u8> as *mut BytesWriter) }
    }

    #[inline]
    pub(crate) fn over_ref(out: &Vec<u8>) -> &BytesWriter {
        // repr(transparent) over Vec<u8>.
        unsafe { &*(out as *const Vec<u8> as *const BytesWriter) }
    }

    /// Appends `b` and returns the appended copy, to change in place.
    #[inline]
    pub fn append(&mut self, b: &[u8]) -> &mut [u8] {
        let at = self.buf.len();
        self.buf.extend_from_slice(b);
        &mut self.buf[at..]
    }

    /// Appends bytes.
    #[inline]
    pub fn write_bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b)
    }

    /// Appends one byte.
    #[inline]
    pub fn push(&mut self, b: u8) {
        self.buf.push(b)
    }

    /// Reserves room for `n` more bytes.
    #[inline]
    pub fn reserve(&mut self, n: usize) {
        self.buf.reserve(n)
    }
}

impl Extend<u8> for BytesWriter {
    #[inline]
    fn extend<T: IntoIterator<Item = u8>>(&mut self, iter: T) {
        self.buf.extend(iter)
    }
}

impl<'b> Extend<&'b u8> for BytesWriter {
    #[inline]
    fn extend<T: IntoIterator<Item = &'b u8>>(&mut self, iter: T) {
        self.buf.extend(iter)
    }
}

impl fmt::Write for BytesWriter {
    #[inline]
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.buf.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Writes a value of codec `C` into the output frame with [`Codec::encode`]
/// (the [`WriteCodec::Writer`] of `I64`, `F64` and of codecs without a
/// writer of their own). Write one value per record.
#[repr(transparent)]
pub struct Encoder<C: Codec> {
    buf: Vec<u8>,
    _c: PhantomData<fn() -> C>,
}

impl<C: Codec> Encoder<C> {
    /// The encoder over `out` (for [`WriteCodec::writer`]).
    #[inline]
    pub fn over(out: &mut Vec<u8>) -> &mut Encoder<C> {
        // repr(transparent) over Vec<u8> (the other field is zero-sized).
        unsafe { &mut *(out as *mut Vec<u8> as *mut Encoder<C>) }
    }

    /// Appends the encoding of `v`.
    #[inline]
    pub fn write(&mut self, v: &C::Item) {
        C::encode(v, &mut self.buf)
    }
}

/// Encodes `v` into a new vector.
pub fn encode_to_vec<C: Codec>(v: &C::Item) -> Vec<u8> {
    let mut out = Vec::new();
    C::encode(v, &mut out);
    out
}
