//! Typed stateless helpers (SPEC14 section 4): the record value is decoded
//! with a [`Codec`], the function works on typed values, the result is
//! encoded straight into the output frame. Key and timestamp pass through.
//! A value that does not decode is rejected ([`crate::reject`]), so the job
//! file's `on_error` decides (skip, dead letter, fail).
//!
//! The helpers keep one spare allocation between records: the input is
//! decoded into it ([`Codec::decode_reusing`]) and the output's (or the
//! input's, for filters) is taken back after encoding ([`Codec::recycle`]).
//! A function that changes its input in place and returns it
//! (`|mut s: String| { s.make_ascii_uppercase(); Ok(s) }`) then allocates
//! nothing per record.
//!
//! ```ignore
//! use streamd::{map_typed, Str};
//! fn upper(s: String) -> streamd::Result<String> { Ok(s.to_ascii_uppercase()) }
//! streamd::export_map_typed!(Str, Str, upper);
//! ```
//!
//! The `*_view` helpers ([`map_view`], [`filter_view`], [`flat_map_view`],
//! [`process_view`]) copy nothing: the function borrows the value from the
//! record ([`ViewCodec`]: `&str` for `Str`, `&[u8]` for `Bytes`) and writes
//! its result straight into the output frame ([`WriteCodec`]: a
//! [`StrWriter`](crate::codec::StrWriter) for `Str`). They cost about what
//! the hand-written `emit_with` does:
//!
//! ```ignore
//! use streamd::{Str, StrWriter};
//! fn upper(s: &str, out: &mut StrWriter) -> streamd::Result<()> {
//!     out.push_str(s).make_ascii_uppercase();
//!     Ok(())
//! }
//! streamd::export_map_view!(Str, Str, upper);
//! ```

use crate::codec::{Codec, ViewCodec, WriteCodec};
use crate::{emit_with, emit_with_headers, reject, Headers, Operator, Record, Result};
use core::marker::PhantomData;

/// Decodes the record value into the spare allocation `spare`.
#[inline]
fn decode<C: Codec>(what: &str, rec: &Record<'_>, spare: &mut Vec<u8>) -> Result<C::Item> {
    C::decode_reusing(rec.value, core::mem::take(spare)).map_err(|e| reject(format!("{}: cannot decode the record value: {}", what, e)))
}

/// Keeps `v`'s allocation for the next record.
#[inline]
fn keep<C: Codec>(v: C::Item, spare: &mut Vec<u8>) {
    if let Some(b) = C::recycle(v) {
        if b.capacity() <= 1 << 20 {
            *spare = b;
        }
    }
}

/// Emits a record whose value is `v` encoded with `C`, written straight into
/// the output frame.
#[inline]
pub fn emit_typed<C: Codec>(key: &[u8], v: &C::Item, timestamp: i64) {
    emit_with(key, timestamp, |w| C::encode(v, w.vec()))
}

/// [`emit_typed`] for a record with `headers` (an input record's, which the
/// typed helpers keep on what they emit for it).
#[inline]
pub fn emit_typed_with_headers<C: Codec>(key: &[u8], v: &C::Item, timestamp: i64, headers: Headers<'_>) {
    emit_with_headers(key, timestamp, headers, |w| C::encode(v, w.vec()))
}

/// See [`map_typed`].
pub struct MapTyped<I, O, F> {
    f: F,
    spare: Vec<u8>,
    _c: PhantomData<fn() -> (I, O)>,
}

/// Emits `f(value)` for every record (Go `MapOf`).
pub fn map_typed<I: Codec, O: Codec, F: FnMut(I::Item) -> Result<O::Item>>(f: F) -> MapTyped<I, O, F> {
    MapTyped { f, spare: Vec::new(), _c: PhantomData }
}

impl<I: Codec, O: Codec, F: FnMut(I::Item) -> Result<O::Item>> Operator for MapTyped<I, O, F> {
    #[inline]
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let out = (self.f)(decode::<I>("map_typed", rec, &mut self.spare)?)?;
        emit_typed_with_headers::<O>(rec.key, &out, rec.timestamp, rec.headers);
        keep::<O>(out, &mut self.spare);
        Ok(())
    }
}

/// See [`filter_typed`].
pub struct FilterTyped<C, F> {
    f: F,
    spare: Vec<u8>,
    _c: PhantomData<fn() -> C>,
}

/// Emits the records whose decoded value `f` accepts, unchanged (Go `FilterOf`).
pub fn filter_typed<C: Codec, F: FnMut(&C::Item) -> bool>(f: F) -> FilterTyped<C, F> {
    FilterTyped { f, spare: Vec::new(), _c: PhantomData }
}

impl<C: Codec, F: FnMut(&C::Item) -> bool> Operator for FilterTyped<C, F> {
    #[inline]
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let v = decode::<C>("filter_typed", rec, &mut self.spare)?;
        if (self.f)(&v) {
            crate::emit_record(rec);
        }
        keep::<C>(v, &mut self.spare);
        Ok(())
    }
}

/// Where a [`flat_map_typed`] function emits: typed values with the input
/// record's key, timestamp and headers, or with a key of their own.
pub struct TypedCollector<'a, O> {
    key: &'a [u8],
    ts: i64,
    headers: Headers<'a>,
    _c: PhantomData<fn() -> O>,
}

impl<'a, O: Codec> TypedCollector<'a, O> {
    /// Emits `v` with the input record's key, timestamp and headers.
    #[inline]
    pub fn emit(&mut self, v: &O::Item) {
        emit_typed_with_headers::<O>(self.key, v, self.ts, self.headers)
    }

    /// Emits `v` with key `key` and the input record's timestamp and headers.
    #[inline]
    pub fn emit_keyed(&mut self, key: &[u8], v: &O::Item) {
        emit_typed_with_headers::<O>(key, v, self.ts, self.headers)
    }
}

/// See [`flat_map_typed`].
pub struct FlatMapTyped<I, O, F> {
    f: F,
    spare: Vec<u8>,
    _c: PhantomData<fn() -> (I, O)>,
}

/// Calls `f(value, collector)` for every record; `f` emits any number of
/// typed values (Go `FlatMapOf`).
pub fn flat_map_typed<I: Codec, O: Codec, F>(f: F) -> FlatMapTyped<I, O, F>
where
    F: FnMut(I::Item, &mut TypedCollector<'_, O>) -> Result<()>,
{
    FlatMapTyped { f, spare: Vec::new(), _c: PhantomData }
}

impl<I: Codec, O: Codec, F> Operator for FlatMapTyped<I, O, F>
where
    F: FnMut(I::Item, &mut TypedCollector<'_, O>) -> Result<()>,
{
    #[inline]
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let v = decode::<I>("flat_map_typed", rec, &mut self.spare)?;
        (self.f)(v, &mut TypedCollector { key: rec.key, ts: rec.timestamp, headers: rec.headers, _c: PhantomData })
    }
}

/// See [`process_typed`].
pub struct ProcessTyped<I, F> {
    f: F,
    spare: Vec<u8>,
    _c: PhantomData<fn() -> I>,
}

/// Calls `f(value, record)` for every record, with the record's key as the
/// current key (so it may use keyed state and timers); `f` emits itself
/// (Go `ProcessOf`).
pub fn process_typed<I: Codec, F: FnMut(I::Item, &Record<'_>) -> Result<()>>(f: F) -> ProcessTyped<I, F> {
    ProcessTyped { f, spare: Vec::new(), _c: PhantomData }
}

impl<I: Codec, F: FnMut(I::Item, &Record<'_>) -> Result<()>> Operator for ProcessTyped<I, F> {
    #[inline]
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let v = decode::<I>("process_typed", rec, &mut self.spare)?;
        (self.f)(v, rec)
    }
}

/// Decodes the record value as a view for `f`; a value that does not decode
/// rejects the record, an error of `f` is returned as it is.
#[inline]
fn with_view<C: ViewCodec, R>(what: &str, rec: &Record<'_>, f: impl FnOnce(&C::View) -> Result<R>) -> Result<R> {
    match C::with_view(rec.value, f) {
        Ok(r) => r,
        Err(e) => Err(reject(format!("{}: cannot decode the record value: {}", what, e))),
    }
}

/// See [`map_view`].
pub struct MapView<I, O, F> {
    f: F,
    _c: PhantomData<fn() -> (I, O)>,
}

/// Calls `f(value, writer)` for every record: `value` is borrowed from the
/// record (`&str` for `Str`), and what `f` writes to `writer` is the value of
/// the record emitted with the input's key and timestamp, written straight
/// into the output frame (Go `MapOf`; nothing is copied or allocated). `f`
/// must not emit itself. When `f` fails, what it wrote is emitted and undone
/// with the failed batch (as every emit of a failed or rejected batch).
pub fn map_view<I: ViewCodec, O: WriteCodec, F: FnMut(&I::View, &mut O::Writer) -> Result<()>>(f: F) -> MapView<I, O, F> {
    MapView { f, _c: PhantomData }
}

impl<I: ViewCodec, O: WriteCodec, F: FnMut(&I::View, &mut O::Writer) -> Result<()>> Operator for MapView<I, O, F> {
    #[inline]
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let f = &mut self.f;
        with_view::<I, _>("map_view", rec, |v| {
            let mut r = Ok(());
            emit_with_headers(rec.key, rec.timestamp, rec.headers, |w| r = f(v, O::writer(w.vec())));
            r
        })
    }
}

/// See [`filter_view`].
pub struct FilterView<C, F> {
    f: F,
    _c: PhantomData<fn() -> C>,
}

/// Emits the records whose value, borrowed (`&str` for `Str`), `f` accepts,
/// unchanged (Go `FilterOf`; nothing is copied).
pub fn filter_view<C: ViewCodec, F: FnMut(&C::View) -> bool>(f: F) -> FilterView<C, F> {
    FilterView { f, _c: PhantomData }
}

impl<C: ViewCodec, F: FnMut(&C::View) -> bool> Operator for FilterView<C, F> {
    #[inline]
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let f = &mut self.f;
        if with_view::<C, _>("filter_view", rec, |v| Ok(f(v)))? {
            crate::emit_record(rec);
        }
        Ok(())
    }
}

/// Where a [`flat_map_view`] function emits: each emit writes one value
/// straight into the output frame.
pub struct ViewCollector<'a, O> {
    key: &'a [u8],
    ts: i64,
    headers: Headers<'a>,
    _c: PhantomData<fn() -> O>,
}

impl<'a, O: WriteCodec> ViewCollector<'a, O> {
    /// Emits the value `write` writes, with the input record's key,
    /// timestamp and headers. `write` must not emit itself.
    #[inline]
    pub fn emit(&mut self, write: impl FnOnce(&mut O::Writer)) {
        emit_with_headers(self.key, self.ts, self.headers, |w| write(O::writer(w.vec())))
    }

    /// Emits the value `write` writes, with key `key` and the input record's
    /// timestamp and headers.
    #[inline]
    pub fn emit_keyed(&mut self, key: &[u8], write: impl FnOnce(&mut O::Writer)) {
        emit_with_headers(key, self.ts, self.headers, |w| write(O::writer(w.vec())))
    }
}

/// See [`flat_map_view`].
pub struct FlatMapView<I, O, F> {
    f: F,
    _c: PhantomData<fn() -> (I, O)>,
}

/// Calls `f(value, collector)` for every record with the value borrowed
/// (Go `FlatMapOf`); `f` emits any number of values through the collector.
pub fn flat_map_view<I: ViewCodec, O: WriteCodec, F>(f: F) -> FlatMapView<I, O, F>
where
    F: FnMut(&I::View, &mut ViewCollector<'_, O>) -> Result<()>,
{
    FlatMapView { f, _c: PhantomData }
}

impl<I: ViewCodec, O: WriteCodec, F> Operator for FlatMapView<I, O, F>
where
    F: FnMut(&I::View, &mut ViewCollector<'_, O>) -> Result<()>,
{
    #[inline]
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let f = &mut self.f;
        with_view::<I, _>("flat_map_view", rec, |v| f(v, &mut ViewCollector { key: rec.key, ts: rec.timestamp, headers: rec.headers, _c: PhantomData }))
    }
}

/// See [`process_view`].
pub struct ProcessView<I, F> {
    f: F,
    _c: PhantomData<fn() -> I>,
}

/// Calls `f(value, record)` for every record with the value borrowed and the
/// record's key as the current key (Go `ProcessOf`); `f` emits itself.
pub fn process_view<I: ViewCodec, F: FnMut(&I::View, &Record<'_>) -> Result<()>>(f: F) -> ProcessView<I, F> {
    ProcessView { f, _c: PhantomData }
}

impl<I: ViewCodec, F: FnMut(&I::View, &Record<'_>) -> Result<()>> Operator for ProcessView<I, F> {
    #[inline]
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let f = &mut self.f;
        with_view::<I, _>("process_view", rec, |v| f(v, rec))
    }
}

/// Exports [`map_view`] of a function `fn(&In::View, &mut Out::Writer) -> Result<()>`:
/// `export_map_view!(Str, Str, upper)`.
#[macro_export]
macro_rules! export_map_view {
    ($in:ty, $out:ty, $f:path) => {
        $crate::export_operator!(
            $crate::typed::MapView<$in, $out, for<'a, 'b> fn(&'a <$in as $crate::codec::ViewCodec>::View, &'b mut <$out as $crate::codec::WriteCodec>::Writer) -> $crate::Result<()>>,
            $crate::typed::map_view::<$in, $out, _>($f as for<'a, 'b> fn(&'a <$in as $crate::codec::ViewCodec>::View, &'b mut <$out as $crate::codec::WriteCodec>::Writer) -> $crate::Result<()>)
        );
    };
}

/// Exports [`filter_view`] of a function `fn(&C::View) -> bool`.
#[macro_export]
macro_rules! export_filter_view {
    ($c:ty, $f:path) => {
        $crate::export_operator!(
            $crate::typed::FilterView<$c, for<'a> fn(&'a <$c as $crate::codec::ViewCodec>::View) -> bool>,
            $crate::typed::filter_view::<$c, _>($f as for<'a> fn(&'a <$c as $crate::codec::ViewCodec>::View) -> bool)
        );
    };
}

/// Exports [`map_typed`] of a function `fn(In::Item) -> Result<Out::Item>`:
/// `export_map_typed!(Str, Str, upper)`.
#[macro_export]
macro_rules! export_map_typed {
    ($in:ty, $out:ty, $f:path) => {
        $crate::export_operator!(
            $crate::typed::MapTyped<$in, $out, fn(<$in as $crate::Codec>::Item) -> $crate::Result<<$out as $crate::Codec>::Item>>,
            $crate::typed::map_typed::<$in, $out, _>($f as fn(<$in as $crate::Codec>::Item) -> $crate::Result<<$out as $crate::Codec>::Item>)
        );
    };
}

/// Exports [`filter_typed`] of a function `fn(&C::Item) -> bool`.
#[macro_export]
macro_rules! export_filter_typed {
    ($c:ty, $f:path) => {
        $crate::export_operator!(
            $crate::typed::FilterTyped<$c, for<'a> fn(&'a <$c as $crate::Codec>::Item) -> bool>,
            $crate::typed::filter_typed::<$c, _>($f as for<'a> fn(&'a <$c as $crate::Codec>::Item) -> bool)
        );
    };
}
