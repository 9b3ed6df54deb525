//! Keyed state of the current key (SPEC14 section 4): [`ValueState`],
//! [`ListState`], [`MapState`], [`ReducingState`] and [`AggregatingState`],
//! typed by a [`Codec`], with optional TTL ([`ValueState::with_ttl`] etc.)
//! and namespaces (`in_namespace`, e.g. one per window).
//!
//! The key is the SDK's current key: the record's in `process_element`, the
//! timer's in `on_timer` / `on_processing_time`. Elsewhere (open, on_watermark,
//! finish, ...) there is none and a keyed call fails the subtask with
//! "state S: no current key in PHASE". A value that does not decode fails the
//! subtask too, naming the state.
//!
//! Storage (abi/ABI.md): a [`ValueState`] without namespace and TTL is the
//! ABI v1 keyed state `(name, key)` (`state_get/put/delete`), so values that
//! the deprecated key-taking methods or an older module wrote read back.
//! Everything else is a structured entry `(name, key, namespace, user key)`
//! (`mstate_*`): a value in a namespace or with TTL, a list, map entries.

use crate::codec::{Bytes, Codec};
use crate::keyed::with_current;
use crate::{sys, Error};
use core::fmt;
use core::marker::PhantomData;

/// When a TTL'd entry's expiry is renewed (Flink's `StateTtlConfig.UpdateType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlUpdate {
    /// The TTL runs from the last write.
    OnCreateAndWrite,
    /// The TTL runs from the last write or read.
    OnReadAndWrite,
}

/// The name, namespace and TTL every state descriptor carries.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Desc {
    name: &'static str,
    ns: Vec<u8>,
    ttl: bool,
}

impl Desc {
    const fn new(name: &'static str) -> Desc {
        Desc { name, ns: Vec::new(), ttl: false }
    }

    fn set_ttl(&mut self, ms: i64, update: TtlUpdate) {
        if crate::keyed::phase() != "open" {
            crate::fail(&format!("state {:?}: with_ttl must be called in open (it is in {})", self.name, crate::keyed::phase()));
        }
        if ms < 0 {
            crate::fail(&format!("state {:?}: negative TTL {} ms", self.name, ms));
        }
        let flags = if update == TtlUpdate::OnReadAndWrite { 1 } else { 0 };
        sys::state_ttl(self.name.as_bytes(), ms, flags);
        self.ttl = ms > 0;
    }

    fn in_ns(&self, ns: &[u8]) -> Desc {
        Desc { name: self.name, ns: ns.to_vec(), ttl: self.ttl }
    }

    /// Reads an entry into `buf`; false when absent.
    fn get(&self, key: &[u8], ukey: &[u8], buf: &mut Vec<u8>) -> bool {
        buf.clear();
        read_growing(buf, |p, c| sys::mstate_get(self.name.as_bytes(), key, self.ns.as_slice(), ukey, p, c))
    }
}

impl fmt::Display for Desc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "state {:?}", self.name)?;
        if !self.ns.is_empty() {
            write!(f, " (namespace {:?})", String::from_utf8_lossy(&self.ns))?;
        }
        Ok(())
    }
}

fn decode_or_fail<C: Codec>(d: &dyn fmt::Display, what: &str, b: &[u8]) -> C::Item {
    match C::decode(b) {
        Ok(v) => v,
        Err(e) => crate::fail(&format!("{}: cannot decode the {}: {}", d, what, e)),
    }
}

/// The structured-entry imports a [`ValueState`] uses once it has a
/// namespace or a TTL. Called through pointers that only `in_namespace` and
/// `with_ttl` set, so a module whose value states have neither does not
/// import `mstate_*` and loads on hosts older than SPEC14.
struct Mops {
    get: fn(&[u8], &[u8], &[u8], &[u8], *mut u8, usize) -> i32,
    put: fn(&[u8], &[u8], &[u8], &[u8], &[u8]),
    remove: fn(&[u8], &[u8], &[u8], &[u8]),
}

const MOPS: Mops = Mops { get: sys::mstate_get, put: sys::mstate_put, remove: sys::mstate_remove };

/// One value per key (and namespace): Flink's `ValueState`.
///
/// ```ignore
/// const COUNT: ValueState<I64> = ValueState::new("count");
/// let n = COUNT.get().unwrap_or(0);
/// COUNT.set(&(n + 1));
/// ```
pub struct ValueState<C: Codec = Bytes> {
    d: Desc,
    m: Option<&'static Mops>,
    _c: PhantomData<fn() -> C>,
}

impl<C: Codec> Clone for ValueState<C> {
    fn clone(&self) -> Self {
        ValueState { d: self.d.clone(), m: self.m, _c: PhantomData }
    }
}

impl<C: Codec> fmt::Debug for ValueState<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ValueState({})", self.d)
    }
}

impl<C: Codec> ValueState<C> {
    /// The state called `name` (usable in a `const`).
    pub const fn new(name: &'static str) -> Self {
        ValueState { d: Desc::new(name), m: None, _c: PhantomData }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.d.name
    }

    /// Gives entries of this state (by name: every namespace) a time to live
    /// of `ms` milliseconds of processing time; call it in `open` (it tells the
    /// host once). Expired values read as absent.
    pub fn with_ttl(mut self, ms: i64, update: TtlUpdate) -> Self {
        self.d.set_ttl(ms, update);
        if self.d.ttl {
            self.m = Some(&MOPS);
        }
        self
    }

    /// The same state in namespace `ns` (e.g. a window).
    pub fn in_namespace(&self, ns: &[u8]) -> Self {
        ValueState { d: self.d.in_ns(ns), m: Some(&MOPS), _c: PhantomData }
    }

    /// The raw value of the current key into `buf`; false when absent.
    pub fn get_raw(&self, buf: &mut Vec<u8>) -> bool {
        with_current(&self.d, |k| {
            buf.clear();
            let name = self.d.name.as_bytes();
            match self.m {
                Some(m) => read_growing(buf, |p, c| (m.get)(name, k, &self.d.ns, b"", p, c)),
                None => read_growing(buf, |p, c| sys::state_get(name, k, p, c)),
            }
        })
    }

    /// Sets the raw value of the current key.
    pub fn set_raw(&self, v: &[u8]) {
        with_current(&self.d, |k| match self.m {
            Some(m) => (m.put)(self.d.name.as_bytes(), k, &self.d.ns, b"", v),
            None => sys::state_put(self.d.name.as_bytes(), k, v),
        })
    }

    /// The value of the current key, `None` when it has none.
    pub fn get(&self) -> Option<C::Item> {
        let mut b = Vec::new();
        if self.get_raw(&mut b) {
            Some(decode_or_fail::<C>(&self.d, "value", &b))
        } else {
            None
        }
    }

    /// Sets the value of the current key.
    pub fn set(&self, v: &C::Item) {
        let mut b = Vec::new();
        C::encode(v, &mut b);
        self.set_raw(&b)
    }

    /// Removes the value of the current key.
    pub fn clear(&self) {
        with_current(&self.d, |k| match self.m {
            Some(m) => (m.remove)(self.d.name.as_bytes(), k, &self.d.ns, b""),
            None => sys::state_delete(self.d.name.as_bytes(), k),
        })
    }

    /// Deprecated (ABI v1 style, explicit key): the value of `key` into `buf`.
    #[deprecated(note = "keyed state follows the current key: use get_raw / get")]
    pub fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> bool {
        buf.clear();
        read_growing(buf, |ptr, cap| sys::state_get(self.d.name.as_bytes(), key, ptr, cap))
    }

    /// Deprecated (explicit key): the value of `key`, `None` when it has none.
    #[deprecated(note = "keyed state follows the current key: use get")]
    pub fn get_key(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        #[allow(deprecated)]
        let found = self.get_into(key, &mut v);
        if found {
            Some(v)
        } else {
            None
        }
    }

    /// Deprecated (explicit key): sets the value of `key`.
    #[deprecated(note = "keyed state follows the current key: use set")]
    pub fn put(&self, key: &[u8], value: &[u8]) {
        sys::state_put(self.d.name.as_bytes(), key, value)
    }

    /// Deprecated (explicit key): deletes the value of `key`.
    #[deprecated(note = "keyed state follows the current key: use clear")]
    pub fn delete(&self, key: &[u8]) {
        sys::state_delete(self.d.name.as_bytes(), key)
    }

    /// Deprecated (explicit key): the value of `key` as a little-endian u64,
    /// an error when it is not 8 bytes.
    #[deprecated(note = "use ValueState<I64>::get")]
    pub fn get_u64(&self, key: &[u8]) -> Result<Option<u64>, Error> {
        let mut b = [0u8; 8];
        let n = sys::state_get(self.d.name.as_bytes(), key, b.as_mut_ptr(), 8);
        match n {
            -1 => Ok(None),
            8 => Ok(Some(u64::from_le_bytes(b))),
            n => Err(Error::new(format!(
                "state {:?} of key {:?} holds {} bytes, not a little-endian u64",
                self.d.name,
                String::from_utf8_lossy(key),
                n
            ))),
        }
    }

    /// Deprecated (explicit key): stores `v` as a little-endian u64.
    #[deprecated(note = "use ValueState<I64>::set")]
    pub fn put_u64(&self, key: &[u8], v: u64) {
        sys::state_put(self.d.name.as_bytes(), key, &v.to_le_bytes())
    }
}

/// A list per key (and namespace): Flink's `ListState`. Elements expire one
/// by one under TTL.
pub struct ListState<C: Codec = Bytes> {
    d: Desc,
    _c: PhantomData<fn() -> C>,
}

impl<C: Codec> Clone for ListState<C> {
    fn clone(&self) -> Self {
        ListState { d: self.d.clone(), _c: PhantomData }
    }
}

impl<C: Codec> ListState<C> {
    /// The list state called `name`.
    pub const fn new(name: &'static str) -> Self {
        ListState { d: Desc::new(name), _c: PhantomData }
    }

    /// See [`ValueState::with_ttl`]; each element expires on its own.
    pub fn with_ttl(mut self, ms: i64, update: TtlUpdate) -> Self {
        self.d.set_ttl(ms, update);
        self
    }

    /// The same state in namespace `ns`.
    pub fn in_namespace(&self, ns: &[u8]) -> Self {
        ListState { d: self.d.in_ns(ns), _c: PhantomData }
    }

    /// Appends `v` to the current key's list.
    pub fn add(&self, v: &C::Item) {
        let mut b = Vec::new();
        C::encode(v, &mut b);
        self.add_raw(&b)
    }

    /// Appends raw bytes.
    pub fn add_raw(&self, v: &[u8]) {
        with_current(&self.d, |k| sys::mstate_append(self.d.name.as_bytes(), k, &self.d.ns, b"", v))
    }

    /// The elements in append order (empty when there are none).
    pub fn get(&self) -> Vec<C::Item> {
        let mut out = Vec::new();
        self.for_each_raw(|b| out.push(decode_or_fail::<C>(&self.d, "list element", b)));
        out
    }

    /// Calls `f` on each raw element in append order.
    pub fn for_each_raw(&self, mut f: impl FnMut(&[u8])) {
        let mut buf = Vec::new();
        if !with_current(&self.d, |k| self.d.get(k, b"", &mut buf)) {
            return;
        }
        if let Err(e) = parse_list(&buf, &mut f) {
            crate::fail(&format!("{}: malformed list frame from the host: {}", self.d, e))
        }
    }

    /// Replaces the list by `vs` (removes it when `vs` is empty).
    pub fn update(&self, vs: &[C::Item]) {
        self.clear();
        let mut b = Vec::new();
        for v in vs {
            b.clear();
            C::encode(v, &mut b);
            self.add_raw(&b);
        }
    }

    /// Removes the current key's list.
    pub fn clear(&self) {
        with_current(&self.d, |k| sys::mstate_remove(self.d.name.as_bytes(), k, &self.d.ns, b""))
    }
}

/// A map per key (and namespace): Flink's `MapState`. Entries come back
/// sorted by their encoded user key.
pub struct MapState<KC: Codec = Bytes, VC: Codec = Bytes> {
    d: Desc,
    _c: PhantomData<fn() -> (KC, VC)>,
}

impl<KC: Codec, VC: Codec> Clone for MapState<KC, VC> {
    fn clone(&self) -> Self {
        MapState { d: self.d.clone(), _c: PhantomData }
    }
}

impl<KC: Codec, VC: Codec> MapState<KC, VC> {
    /// The map state called `name`.
    pub const fn new(name: &'static str) -> Self {
        MapState { d: Desc::new(name), _c: PhantomData }
    }

    /// See [`ValueState::with_ttl`]; each entry expires on its own.
    pub fn with_ttl(mut self, ms: i64, update: TtlUpdate) -> Self {
        self.d.set_ttl(ms, update);
        self
    }

    /// The same state in namespace `ns`.
    pub fn in_namespace(&self, ns: &[u8]) -> Self {
        MapState { d: self.d.in_ns(ns), _c: PhantomData }
    }

    fn ukey(k: &KC::Item) -> Vec<u8> {
        let mut b = Vec::new();
        KC::encode(k, &mut b);
        b
    }

    /// The value of user key `k`.
    pub fn get(&self, k: &KC::Item) -> Option<VC::Item> {
        let uk = Self::ukey(k);
        let mut buf = Vec::new();
        if with_current(&self.d, |key| self.d.get(key, &uk, &mut buf)) {
            Some(decode_or_fail::<VC>(&self.d, "map value", &buf))
        } else {
            None
        }
    }

    /// Sets the value of user key `k`.
    pub fn put(&self, k: &KC::Item, v: &VC::Item) {
        let uk = Self::ukey(k);
        let mut b = Vec::new();
        VC::encode(v, &mut b);
        with_current(&self.d, |key| sys::mstate_put(self.d.name.as_bytes(), key, &self.d.ns, &uk, &b))
    }

    /// Removes user key `k`.
    pub fn remove(&self, k: &KC::Item) {
        let uk = Self::ukey(k);
        with_current(&self.d, |key| sys::mstate_remove(self.d.name.as_bytes(), key, &self.d.ns, &uk))
    }

    /// Whether user key `k` has a value.
    pub fn contains(&self, k: &KC::Item) -> bool {
        let uk = Self::ukey(k);
        // A zero capacity asks for the length only.
        with_current(&self.d, |key| sys::mstate_get(self.d.name.as_bytes(), key, &self.d.ns, &uk, core::ptr::null_mut(), 0) >= 0)
    }

    /// Calls `f(user key, value)` on each raw entry, sorted by user key.
    pub fn for_each_raw(&self, mut f: impl FnMut(&[u8], &[u8])) {
        let mut buf = Vec::new();
        let found = with_current(&self.d, |key| {
            read_growing(&mut buf, |p, c| sys::mstate_entries(self.d.name.as_bytes(), key, &self.d.ns, p, c))
        });
        if !found {
            return;
        }
        if let Err(e) = parse_entries(&buf, &mut f) {
            crate::fail(&format!("{}: malformed entries frame from the host: {}", self.d, e))
        }
    }

    /// All entries, sorted by encoded user key.
    pub fn entries(&self) -> Vec<(KC::Item, VC::Item)> {
        let mut out = Vec::new();
        self.for_each_raw(|k, v| out.push((decode_or_fail::<KC>(&self.d, "map key", k), decode_or_fail::<VC>(&self.d, "map value", v))));
        out
    }

    /// Whether the current key has no entry.
    pub fn is_empty(&self) -> bool {
        with_current(&self.d, |key| sys::mstate_entries(self.d.name.as_bytes(), key, &self.d.ns, core::ptr::null_mut(), 0) < 0)
    }

    /// Removes every entry of the current key (in this namespace).
    pub fn clear(&self) {
        with_current(&self.d, |key| sys::mstate_clear(self.d.name.as_bytes(), key, &self.d.ns))
    }
}

/// A value folded with a reduce function: Flink's `ReducingState`.
pub struct ReducingState<C: Codec, F> {
    v: ValueState<C>,
    f: F,
}

impl<C: Codec, F: Fn(C::Item, C::Item) -> C::Item> ReducingState<C, F> {
    /// The reducing state called `name`, folding with `reduce(acc, v)`.
    pub fn new(name: &'static str, reduce: F) -> Self {
        ReducingState { v: ValueState::new(name), f: reduce }
    }

    /// See [`ValueState::with_ttl`].
    pub fn with_ttl(mut self, ms: i64, update: TtlUpdate) -> Self {
        self.v = self.v.with_ttl(ms, update);
        self
    }

    /// The same state in namespace `ns`.
    pub fn in_namespace(&self, ns: &[u8]) -> Self
    where
        F: Clone,
    {
        ReducingState { v: self.v.in_namespace(ns), f: self.f.clone() }
    }

    /// Folds `v` into the current key's value.
    pub fn add(&self, v: C::Item) {
        let next = match self.v.get() {
            Some(acc) => (self.f)(acc, v),
            None => v,
        };
        self.v.set(&next)
    }

    /// The folded value.
    pub fn get(&self) -> Option<C::Item> {
        self.v.get()
    }

    /// Removes it.
    pub fn clear(&self) {
        self.v.clear()
    }
}

/// An aggregate function: Flink's `AggregateFunction` (accumulator in,
/// accumulator out, so a window can hold it in state).
pub trait Aggregator {
    /// The input element.
    type In;
    /// The accumulator, kept in state.
    type Acc;
    /// The result.
    type Out;
    /// A new empty accumulator.
    fn create_accumulator(&self) -> Self::Acc;
    /// Adds `v` to `acc`.
    fn add(&self, v: Self::In, acc: Self::Acc) -> Self::Acc;
    /// The result of `acc`.
    fn get_result(&self, acc: &Self::Acc) -> Self::Out;
    /// Merges two accumulators (session windows).
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

/// An accumulator kept with an [`Aggregator`]: Flink's `AggregatingState`.
/// `AC` encodes the accumulator.
pub struct AggregatingState<AC: Codec, A> {
    v: ValueState<AC>,
    agg: A,
}

impl<AC: Codec, A: Aggregator<Acc = AC::Item>> AggregatingState<AC, A> {
    /// The aggregating state called `name`.
    pub fn new(name: &'static str, agg: A) -> Self {
        AggregatingState { v: ValueState::new(name), agg }
    }

    /// See [`ValueState::with_ttl`].
    pub fn with_ttl(mut self, ms: i64, update: TtlUpdate) -> Self {
        self.v = self.v.with_ttl(ms, update);
        self
    }

    /// The same state in namespace `ns`.
    pub fn in_namespace(&self, ns: &[u8]) -> Self
    where
        A: Clone,
    {
        AggregatingState { v: self.v.in_namespace(ns), agg: self.agg.clone() }
    }

    /// Adds `v` to the current key's accumulator.
    pub fn add(&self, v: A::In) {
        let acc = self.v.get().unwrap_or_else(|| self.agg.create_accumulator());
        self.v.set(&self.agg.add(v, acc))
    }

    /// The result, `None` when nothing was added.
    pub fn get(&self) -> Option<A::Out> {
        self.v.get().map(|acc| self.agg.get_result(&acc))
    }

    /// Removes the accumulator.
    pub fn clear(&self) {
        self.v.clear()
    }
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, String> {
    b.get(off..off + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or_else(|| format!("truncated at byte {}", off))
}

fn bytes_at(b: &[u8], off: &mut usize) -> Result<core::ops::Range<usize>, String> {
    let n = u32_at(b, *off)? as usize;
    let start = *off + 4;
    if n > b.len() - start {
        return Err(format!("length {} at byte {} runs past the frame", n, *off));
    }
    *off = start + n;
    Ok(start..start + n)
}

/// Parses a list frame `u32 count; count x (u32 len, bytes)`.
pub(crate) fn parse_list(b: &[u8], f: &mut dyn FnMut(&[u8])) -> Result<(), String> {
    let n = u32_at(b, 0)?;
    let mut off = 4;
    for _ in 0..n {
        let r = bytes_at(b, &mut off)?;
        f(&b[r]);
    }
    if off != b.len() {
        return Err(format!("{} trailing bytes", b.len() - off));
    }
    Ok(())
}

/// Parses an entries frame `u32 count; count x (u32 ukey_len, ukey, u32 val_len, val)`.
pub(crate) fn parse_entries(b: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), String> {
    let n = u32_at(b, 0)?;
    let mut off = 4;
    for _ in 0..n {
        let k = bytes_at(b, &mut off)?;
        let v = bytes_at(b, &mut off)?;
        f(&b[k], &b[v]);
    }
    if off != b.len() {
        return Err(format!("{} trailing bytes", b.len() - off));
    }
    Ok(())
}

/// Calls a host getter with `buf`'s spare capacity, growing it once when the
/// value is larger; returns false when the host has no value.
pub(crate) fn read_growing(buf: &mut Vec<u8>, mut get: impl FnMut(*mut u8, usize) -> i32) -> bool {
    loop {
        let n = get(buf.as_mut_ptr(), buf.capacity());
        if n < 0 {
            return false;
        }
        let n = n as usize;
        if n <= buf.capacity() {
            // The host wrote n bytes into the spare capacity.
            unsafe { buf.set_len(n) };
            return true;
        }
        buf.reserve_exact(n);
    }
}

/// The structured-state imports on the current key, with names of any
/// lifetime and raw bytes: for tools, conformance tests and state
/// descriptors of your own. Values come back as the host returns them (a
/// list entry as a list frame, entries as an entries frame, abi/ABI.md).
pub mod raw {
    use super::read_growing;
    use crate::keyed::with_current;
    use crate::sys;

    fn opt(found: bool, v: Vec<u8>) -> Option<Vec<u8>> {
        if found {
            Some(v)
        } else {
            None
        }
    }

    /// `mstate_get(name, current key, ns, ukey)`.
    pub fn get(name: &str, ns: &[u8], ukey: &[u8]) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        let found = with_current(&format_args!("state {:?}", name), |k| read_growing(&mut v, |p, c| sys::mstate_get(name.as_bytes(), k, ns, ukey, p, c)));
        opt(found, v)
    }

    /// `mstate_entries(name, current key, ns)`: the entries frame.
    pub fn entries(name: &str, ns: &[u8]) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        let found = with_current(&format_args!("state {:?}", name), |k| read_growing(&mut v, |p, c| sys::mstate_entries(name.as_bytes(), k, ns, p, c)));
        opt(found, v)
    }

    /// `mstate_put`.
    pub fn put(name: &str, ns: &[u8], ukey: &[u8], value: &[u8]) {
        with_current(&format_args!("state {:?}", name), |k| sys::mstate_put(name.as_bytes(), k, ns, ukey, value))
    }

    /// `mstate_append`.
    pub fn append(name: &str, ns: &[u8], ukey: &[u8], value: &[u8]) {
        with_current(&format_args!("state {:?}", name), |k| sys::mstate_append(name.as_bytes(), k, ns, ukey, value))
    }

    /// `mstate_remove`.
    pub fn remove(name: &str, ns: &[u8], ukey: &[u8]) {
        with_current(&format_args!("state {:?}", name), |k| sys::mstate_remove(name.as_bytes(), k, ns, ukey))
    }

    /// `mstate_clear`.
    pub fn clear(name: &str, ns: &[u8]) {
        with_current(&format_args!("state {:?}", name), |k| sys::mstate_clear(name.as_bytes(), k, ns))
    }

    /// `state_ttl(name, ttl_ms, flags)` as is (the host allows it in open only).
    pub fn set_ttl(name: &str, ttl_ms: i64, flags: i32) {
        sys::state_ttl(name.as_bytes(), ttl_ms, flags)
    }

    /// The ABI v1 `state_get(name, current key)`.
    pub fn v1_get(name: &str) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        let found = with_current(&format_args!("state {:?}", name), |k| read_growing(&mut v, |p, c| sys::state_get(name.as_bytes(), k, p, c)));
        opt(found, v)
    }

    /// The ABI v1 `state_put(name, current key, value)`.
    pub fn v1_put(name: &str, value: &[u8]) {
        with_current(&format_args!("state {:?}", name), |k| sys::state_put(name.as_bytes(), k, value))
    }
}
