//! Windows (SPEC14 section 4), built on keyed state in namespaces (one per
//! window) and timers: tumbling, sliding and session windows over event time
//! or processing time; reduce, aggregate, process-window and
//! aggregate-then-process functions; allowed lateness with re-firing; late
//! records to a side output or dropped and counted.
//!
//! ```ignore
//! use streamd::{Str, I64, WindowAssigner, Windows};
//! // Count records per key in tumbling 1 minute event-time windows.
//! streamd::export_boxed_operator!(
//!     Windows::<Str>::new(WindowAssigner::tumbling_event_time(60_000, 0))
//!         .allowed_lateness(5_000)
//!         .late_output("late")
//!         .aggregate::<I64, I64, _>(Count)
//! );
//! ```
//!
//! The input must be keyed (a hash edge): windows are per key. A window's
//! output record has the key, the window's max timestamp (`end - 1`) as
//! timestamp and the encoded result as value.
//!
//! Firing (Flink's default triggers): an event-time window fires when the
//! watermark reaches its max timestamp (an event-time timer at it); a
//! processing-time window when processing time does (a processing-time
//! timer; processing-time assigners need `allow_clock: true`). A window's
//! state is kept until max timestamp + allowed lateness (a second timer
//! then clears it); a record for a window that already fired but is not
//! past that fires it again with the updated result. A record all of whose
//! windows are past it is late: sent unchanged to the side output named by
//! [`Windows::late_output`], or dropped and counted
//! ([`WindowOperator::late_dropped`]).
//!
//! State: the window contents are state `"streamd.window.contents"` in namespace
//! [`TimeWindow::namespace`]; session windows keep their set per key in map
//! state `"streamd.window.sessions"` (window -> namespace of its contents).

use crate::codec::{Bytes, Codec};
use crate::state::{Aggregator, ListState, MapState, ValueState};
use crate::{emit_to, reject, Error, Operator, Record, Result};
use core::marker::PhantomData;

const CONTENTS: &str = "streamd.window.contents";
const SESSIONS: &str = "streamd.window.sessions";

/// A time window `[start, end)` in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeWindow {
    /// First millisecond in the window.
    pub start: i64,
    /// First millisecond after it (exclusive).
    pub end: i64,
}

const SIGN: u64 = 1 << 63;

impl TimeWindow {
    /// `[start, end)`.
    pub const fn new(start: i64, end: i64) -> TimeWindow {
        TimeWindow { start, end }
    }

    /// The last millisecond in the window: `end - 1`.
    pub const fn max_timestamp(&self) -> i64 {
        self.end - 1
    }

    /// Whether the windows overlap or touch (session windows merge then).
    pub fn intersects(&self, o: &TimeWindow) -> bool {
        self.start <= o.end && self.end >= o.start
    }

    /// The smallest window covering both.
    pub fn cover(&self, o: &TimeWindow) -> TimeWindow {
        TimeWindow { start: self.start.min(o.start), end: self.end.max(o.end) }
    }

    /// The state namespace of the window: start and end as order-preserving
    /// 8-byte big-endian integers (sign bit flipped), 16 bytes.
    pub fn namespace(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&((self.start as u64) ^ SIGN).to_be_bytes());
        b[8..].copy_from_slice(&((self.end as u64) ^ SIGN).to_be_bytes());
        b
    }

    /// The window of a namespace made by [`TimeWindow::namespace`].
    pub fn from_namespace(b: &[u8]) -> Option<TimeWindow> {
        if b.len() != 16 {
            return None;
        }
        let mut s = [0u8; 8];
        let mut e = [0u8; 8];
        s.copy_from_slice(&b[..8]);
        e.copy_from_slice(&b[8..]);
        Some(TimeWindow { start: (u64::from_be_bytes(s) ^ SIGN) as i64, end: (u64::from_be_bytes(e) ^ SIGN) as i64 })
    }
}

/// Event time (record timestamps, watermarks) or processing time (the host clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeDomain {
    /// Record timestamps; windows fire on watermarks.
    EventTime,
    /// The host's clock (`allow_clock: true`); windows fire on processing-time timers.
    ProcessingTime,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Tumbling { size: i64, offset: i64 },
    Sliding { size: i64, slide: i64, offset: i64 },
    Session { gap: i64 },
}

/// The timer and clock imports of a time domain, reached through pointers
/// that only the assigner's constructors set: a module with event-time windows
/// only does not import the processing-time ones, and the other way round.
struct Clock {
    register: fn(i64),
    delete: fn(i64),
    now: fn() -> i64,
}

fn no_clock() -> i64 {
    i64::MIN
}

const EVENT: Clock = Clock { register: crate::timer::register_event_time, delete: crate::timer::delete_event_time, now: no_clock };
const PROCESSING: Clock =
    Clock { register: crate::timer::register_processing_time, delete: crate::timer::delete_processing_time, now: crate::current_processing_time };

/// Assigns records to windows (Flink's `WindowAssigner`s). Durations in ms.
#[derive(Clone, Copy)]
pub struct WindowAssigner {
    kind: Kind,
    domain: TimeDomain,
    clock: &'static Clock,
}

impl PartialEq for WindowAssigner {
    fn eq(&self, o: &WindowAssigner) -> bool {
        self.kind == o.kind && self.domain == o.domain
    }
}

impl Eq for WindowAssigner {}

impl core::fmt::Debug for WindowAssigner {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "WindowAssigner({:?}, {:?})", self.kind, self.domain)
    }
}

fn positive(what: &str, v: i64) {
    assert!(v > 0, "window assigner: {} must be positive, got {} ms", what, v);
}

impl WindowAssigner {
    /// Tumbling event-time windows of `size` ms, shifted by `offset` ms
    /// (`TumblingEventTimeWindows.of(size, offset)`).
    pub fn tumbling_event_time(size: i64, offset: i64) -> WindowAssigner {
        Self::tumbling(size, offset, TimeDomain::EventTime).with_clock(&EVENT)
    }

    /// Sliding event-time windows of `size` ms every `slide` ms.
    pub fn sliding_event_time(size: i64, slide: i64) -> WindowAssigner {
        Self::sliding(size, slide, 0, TimeDomain::EventTime).with_clock(&EVENT)
    }

    /// Event-time session windows: a session closes after `gap` ms without records.
    pub fn event_time_session(gap: i64) -> WindowAssigner {
        positive("gap", gap);
        WindowAssigner { kind: Kind::Session { gap }, domain: TimeDomain::EventTime, clock: &EVENT }
    }

    /// Tumbling processing-time windows of `size` ms, shifted by `offset` ms.
    pub fn tumbling_processing_time(size: i64, offset: i64) -> WindowAssigner {
        Self::tumbling(size, offset, TimeDomain::ProcessingTime).with_clock(&PROCESSING)
    }

    /// Sliding processing-time windows of `size` ms every `slide` ms.
    pub fn sliding_processing_time(size: i64, slide: i64) -> WindowAssigner {
        Self::sliding(size, slide, 0, TimeDomain::ProcessingTime).with_clock(&PROCESSING)
    }

    /// Processing-time session windows with `gap` ms.
    pub fn processing_time_session(gap: i64) -> WindowAssigner {
        positive("gap", gap);
        WindowAssigner { kind: Kind::Session { gap }, domain: TimeDomain::ProcessingTime, clock: &PROCESSING }
    }

    /// The same tumbling or sliding assigner with its windows shifted by `offset` ms.
    pub fn with_offset(self, offset: i64) -> WindowAssigner {
        let a = match self.kind {
            Kind::Tumbling { size, .. } => Self::tumbling(size, offset, self.domain),
            Kind::Sliding { size, slide, .. } => Self::sliding(size, slide, offset, self.domain),
            Kind::Session { .. } => panic!("window assigner: session windows have no offset"),
        };
        a.with_clock(self.clock)
    }

    fn with_clock(mut self, c: &'static Clock) -> WindowAssigner {
        self.clock = c;
        self
    }

    fn tumbling(size: i64, offset: i64, domain: TimeDomain) -> WindowAssigner {
        positive("size", size);
        assert!(offset.abs() < size, "window assigner: offset {} ms must be smaller than the size {} ms", offset, size);
        WindowAssigner { kind: Kind::Tumbling { size, offset }, domain, clock: &EVENT }
    }

    fn sliding(size: i64, slide: i64, offset: i64, domain: TimeDomain) -> WindowAssigner {
        positive("size", size);
        positive("slide", slide);
        assert!(offset.abs() < slide, "window assigner: offset {} ms must be smaller than the slide {} ms", offset, slide);
        WindowAssigner { kind: Kind::Sliding { size, slide, offset }, domain, clock: &EVENT }
    }

    /// Event or processing time.
    pub fn domain(&self) -> TimeDomain {
        self.domain
    }

    /// Whether windows merge (sessions).
    pub fn is_merging(&self) -> bool {
        matches!(self.kind, Kind::Session { .. })
    }

    /// The windows of an element at `ts` (before merging).
    pub fn assign(&self, ts: i64) -> Vec<TimeWindow> {
        match self.kind {
            Kind::Tumbling { size, offset } => {
                let start = ts - (ts - offset).rem_euclid(size);
                vec![TimeWindow::new(start, start.saturating_add(size))]
            }
            Kind::Sliding { size, slide, offset } => {
                let mut out = Vec::with_capacity((size / slide + 1) as usize);
                let mut start = ts - (ts - offset).rem_euclid(slide);
                while start > ts - size {
                    out.push(TimeWindow::new(start, start.saturating_add(size)));
                    start -= slide;
                }
                out
            }
            Kind::Session { gap } => vec![TimeWindow::new(ts, ts.saturating_add(gap))],
        }
    }

    /// For aligned (non-session) windows: the window whose max timestamp is `ts`, if `ts` is one.
    fn window_with_max(&self, ts: i64) -> Option<TimeWindow> {
        let end = ts.checked_add(1)?;
        let (size, step, offset) = match self.kind {
            Kind::Tumbling { size, offset } => (size, size, offset),
            Kind::Sliding { size, slide, offset } => (size, slide, offset),
            Kind::Session { .. } => return None,
        };
        let start = end - size;
        if (start - offset).rem_euclid(step) == 0 {
            Some(TimeWindow::new(start, end))
        } else {
            None
        }
    }
}

/// Where a process-window function emits: records with the window's key and
/// its max timestamp.
pub struct WindowOutput<'a> {
    key: &'a [u8],
    window: TimeWindow,
}

impl<'a> WindowOutput<'a> {
    /// The key of the window.
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The window.
    pub fn window(&self) -> TimeWindow {
        self.window
    }

    /// Emits `value` with the window's key and max timestamp.
    pub fn emit(&mut self, value: &[u8]) {
        crate::emit(self.key, value, self.window.max_timestamp())
    }

    /// Emits `v` encoded with `C`.
    pub fn emit_typed<C: Codec>(&mut self, v: &C::Item) {
        crate::typed::emit_typed::<C>(self.key, v, self.window.max_timestamp())
    }

    /// Emits `value` with another key (and the window's max timestamp).
    pub fn emit_keyed(&mut self, key: &[u8], value: &[u8]) {
        crate::emit(key, value, self.window.max_timestamp())
    }
}

/// What a window keeps and how it fires: implemented by the functions that
/// [`Windows`] builds ([`Windows::reduce`], [`Windows::aggregate`],
/// [`Windows::process`], [`Windows::aggregate_process`]). All calls run with
/// the window's key as the current key; `ns` is the contents' namespace.
pub trait WindowFunction {
    /// A decoded element.
    type Elem;
    /// Decodes a record value.
    fn prepare(&self, raw: &[u8]) -> Result<Self::Elem>;
    /// Adds an element to the contents in `ns`.
    fn add(&mut self, ns: &[u8], raw: &[u8], e: &Self::Elem);
    /// Moves the contents of `from` into `into` (session merge) and clears `from`.
    fn merge(&mut self, into: &[u8], from: &[u8]);
    /// Emits the result of the contents in `ns`, if there are any.
    fn fire(&mut self, key: &[u8], w: TimeWindow, ns: &[u8]) -> Result<()>;
    /// Clears the contents in `ns`.
    fn clear(&mut self, ns: &[u8]);
}

fn contents<C: Codec>(ns: &[u8]) -> ValueState<C> {
    ValueState::<C>::new(CONTENTS).in_namespace(ns)
}

/// [`Windows::reduce`]'s function.
pub struct ReduceFn<C, F> {
    f: F,
    _c: PhantomData<fn() -> C>,
}

impl<C: Codec, F: FnMut(C::Item, C::Item) -> C::Item> WindowFunction for ReduceFn<C, F>
where
    C::Item: Clone,
{
    type Elem = C::Item;
    fn prepare(&self, raw: &[u8]) -> Result<C::Item> {
        C::decode(raw)
    }
    fn add(&mut self, ns: &[u8], _raw: &[u8], e: &C::Item) {
        let s = contents::<C>(ns);
        let v = match s.get() {
            Some(acc) => (self.f)(acc, e.clone()),
            None => e.clone(),
        };
        s.set(&v)
    }
    fn merge(&mut self, into: &[u8], from: &[u8]) {
        let (a, b) = (contents::<C>(into), contents::<C>(from));
        if let Some(bv) = b.get() {
            let v = match a.get() {
                Some(av) => (self.f)(av, bv),
                None => bv,
            };
            a.set(&v);
            b.clear();
        }
    }
    fn fire(&mut self, key: &[u8], w: TimeWindow, ns: &[u8]) -> Result<()> {
        let mut raw = Vec::new();
        if contents::<C>(ns).get_raw(&mut raw) {
            crate::emit(key, &raw, w.max_timestamp());
        }
        Ok(())
    }
    fn clear(&mut self, ns: &[u8]) {
        contents::<C>(ns).clear()
    }
}

/// [`Windows::aggregate`]'s function (`AC` encodes the accumulator, `OC` the result).
pub struct AggregateFn<IC, AC, OC, A> {
    agg: A,
    _c: PhantomData<fn() -> (IC, AC, OC)>,
}

fn agg_add<AC: Codec, A: Aggregator<Acc = AC::Item>>(agg: &A, ns: &[u8], e: A::In) {
    let s = contents::<AC>(ns);
    let acc = s.get().unwrap_or_else(|| agg.create_accumulator());
    s.set(&agg.add(e, acc))
}

fn agg_merge<AC: Codec, A: Aggregator<Acc = AC::Item>>(agg: &A, into: &[u8], from: &[u8]) {
    let (a, b) = (contents::<AC>(into), contents::<AC>(from));
    if let Some(bv) = b.get() {
        let v = match a.get() {
            Some(av) => agg.merge(av, bv),
            None => bv,
        };
        a.set(&v);
        b.clear();
    }
}

impl<IC, AC, OC, A> WindowFunction for AggregateFn<IC, AC, OC, A>
where
    IC: Codec,
    AC: Codec,
    OC: Codec,
    A: Aggregator<In = IC::Item, Acc = AC::Item, Out = OC::Item>,
    IC::Item: Clone,
{
    type Elem = IC::Item;
    fn prepare(&self, raw: &[u8]) -> Result<IC::Item> {
        IC::decode(raw)
    }
    fn add(&mut self, ns: &[u8], _raw: &[u8], e: &IC::Item) {
        agg_add::<AC, A>(&self.agg, ns, e.clone())
    }
    fn merge(&mut self, into: &[u8], from: &[u8]) {
        agg_merge::<AC, A>(&self.agg, into, from)
    }
    fn fire(&mut self, key: &[u8], w: TimeWindow, ns: &[u8]) -> Result<()> {
        if let Some(acc) = contents::<AC>(ns).get() {
            crate::typed::emit_typed::<OC>(key, &self.agg.get_result(&acc), w.max_timestamp());
        }
        Ok(())
    }
    fn clear(&mut self, ns: &[u8]) {
        contents::<AC>(ns).clear()
    }
}

/// [`Windows::process`]'s function: keeps every element (list state).
pub struct ProcessFn<C, F> {
    f: F,
    _c: PhantomData<fn() -> C>,
}

fn list(ns: &[u8]) -> ListState<Bytes> {
    ListState::<Bytes>::new(CONTENTS).in_namespace(ns)
}

impl<C: Codec, F> WindowFunction for ProcessFn<C, F>
where
    F: FnMut(&[u8], TimeWindow, &[C::Item], &mut WindowOutput<'_>) -> Result<()>,
{
    type Elem = ();
    fn prepare(&self, raw: &[u8]) -> Result<()> {
        C::decode(raw).map(|_| ())
    }
    fn add(&mut self, ns: &[u8], raw: &[u8], _e: &()) {
        list(ns).add_raw(raw)
    }
    fn merge(&mut self, into: &[u8], from: &[u8]) {
        let (a, b) = (list(into), list(from));
        b.for_each_raw(|v| a.add_raw(v));
        b.clear();
    }
    fn fire(&mut self, key: &[u8], w: TimeWindow, ns: &[u8]) -> Result<()> {
        let mut elems = Vec::new();
        let mut err = None;
        list(ns).for_each_raw(|v| match C::decode(v) {
            Ok(e) => elems.push(e),
            Err(e) => err = Some(e),
        });
        if let Some(e) = err {
            return Err(Error::new(format!("window {:?}: cannot decode a stored element: {}", w, e)));
        }
        if elems.is_empty() {
            return Ok(());
        }
        (self.f)(key, w, &elems, &mut WindowOutput { key, window: w })
    }
    fn clear(&mut self, ns: &[u8]) {
        list(ns).clear()
    }
}

/// [`Windows::aggregate_process`]'s function: aggregates incrementally, then
/// passes the result to a process function when the window fires.
pub struct AggregateProcessFn<IC, AC, A, F> {
    agg: A,
    f: F,
    _c: PhantomData<fn() -> (IC, AC)>,
}

impl<IC, AC, A, F> WindowFunction for AggregateProcessFn<IC, AC, A, F>
where
    IC: Codec,
    AC: Codec,
    A: Aggregator<In = IC::Item, Acc = AC::Item>,
    IC::Item: Clone,
    F: FnMut(&[u8], TimeWindow, A::Out, &mut WindowOutput<'_>) -> Result<()>,
{
    type Elem = IC::Item;
    fn prepare(&self, raw: &[u8]) -> Result<IC::Item> {
        IC::decode(raw)
    }
    fn add(&mut self, ns: &[u8], _raw: &[u8], e: &IC::Item) {
        agg_add::<AC, A>(&self.agg, ns, e.clone())
    }
    fn merge(&mut self, into: &[u8], from: &[u8]) {
        agg_merge::<AC, A>(&self.agg, into, from)
    }
    fn fire(&mut self, key: &[u8], w: TimeWindow, ns: &[u8]) -> Result<()> {
        match contents::<AC>(ns).get() {
            Some(acc) => (self.f)(key, w, self.agg.get_result(&acc), &mut WindowOutput { key, window: w }),
            None => Ok(()),
        }
    }
    fn clear(&mut self, ns: &[u8]) {
        contents::<AC>(ns).clear()
    }
}

/// Builds a [`WindowOperator`] over record values decoded with `C`.
pub struct Windows<C: Codec> {
    assigner: WindowAssigner,
    lateness: i64,
    late_output: Option<(String, EmitTo)>,
    _c: PhantomData<fn() -> C>,
}

impl<C: Codec> Windows<C> {
    /// Windows of `assigner`, no allowed lateness, late records dropped.
    pub fn new(assigner: WindowAssigner) -> Self {
        Windows { assigner, lateness: 0, late_output: None, _c: PhantomData }
    }

    /// Keeps each window's state `ms` after its max timestamp (event time):
    /// records within that fire it again (Flink's `allowedLateness`).
    pub fn allowed_lateness(mut self, ms: i64) -> Self {
        assert!(ms >= 0, "windows: allowed lateness must not be negative, got {} ms", ms);
        self.lateness = ms;
        self
    }

    /// Sends late records, unchanged, to side output `name` (Flink's
    /// `sideOutputLateData`; a job file reads it as `OP.name`).
    pub fn late_output(mut self, name: &str) -> Self {
        // Through a pointer: a module without late output does not import emit_to.
        self.late_output = Some((name.to_string(), emit_to as EmitTo));
        self
    }

    fn build<W: WindowFunction>(self, func: W) -> WindowOperator<W> {
        WindowOperator { assigner: self.assigner, lateness: self.lateness, late_output: self.late_output, late_dropped: 0, func }
    }

    /// Folds each window's values with `f`; the result (encoded with `C`) is the output.
    pub fn reduce<F: FnMut(C::Item, C::Item) -> C::Item>(self, f: F) -> WindowOperator<ReduceFn<C, F>>
    where
        C::Item: Clone,
    {
        self.build(ReduceFn { f, _c: PhantomData })
    }

    /// Aggregates each window incrementally; `AC` encodes the accumulator in
    /// state, `OC` the result: `.aggregate::<I64, I64, _>(Count)`.
    pub fn aggregate<AC, OC, A>(self, agg: A) -> WindowOperator<AggregateFn<C, AC, OC, A>>
    where
        AC: Codec,
        OC: Codec,
        A: Aggregator<In = C::Item, Acc = AC::Item, Out = OC::Item>,
        C::Item: Clone,
    {
        self.build(AggregateFn { agg, _c: PhantomData })
    }

    /// Keeps every element; when the window fires calls
    /// `f(key, window, elements, out)` (Flink's `ProcessWindowFunction`).
    pub fn process<F>(self, f: F) -> WindowOperator<ProcessFn<C, F>>
    where
        F: FnMut(&[u8], TimeWindow, &[C::Item], &mut WindowOutput<'_>) -> Result<()>,
    {
        self.build(ProcessFn { f, _c: PhantomData })
    }

    /// Aggregates incrementally and passes the result to
    /// `f(key, window, result, out)` when the window fires (Flink's
    /// `aggregate(aggFunction, windowFunction)`).
    pub fn aggregate_process<AC, A, F>(self, agg: A, f: F) -> WindowOperator<AggregateProcessFn<C, AC, A, F>>
    where
        AC: Codec,
        A: Aggregator<In = C::Item, Acc = AC::Item>,
        C::Item: Clone,
        F: FnMut(&[u8], TimeWindow, A::Out, &mut WindowOutput<'_>) -> Result<()>,
    {
        self.build(AggregateProcessFn { agg, f, _c: PhantomData })
    }
}

type EmitTo = fn(&str, &[u8], &[u8], i64);

/// A keyed window operator (Flink's `WindowOperator` with the default
/// trigger); build one with [`Windows`].
pub struct WindowOperator<W> {
    assigner: WindowAssigner,
    lateness: i64,
    late_output: Option<(String, EmitTo)>,
    late_dropped: u64,
    func: W,
}

fn sessions() -> MapState<Bytes, Bytes> {
    MapState::new(SESSIONS)
}

/// The current key's session windows, each with the namespace of its contents.
fn session_windows(set: &MapState<Bytes, Bytes>) -> Vec<(TimeWindow, Vec<u8>)> {
    let mut all = Vec::new();
    set.for_each_raw(|k, v| {
        if let Some(w) = TimeWindow::from_namespace(k) {
            all.push((w, v.to_vec()))
        }
    });
    all
}

impl<W: WindowFunction> WindowOperator<W> {
    /// How many late records this subtask dropped (no late output set).
    pub fn late_dropped(&self) -> u64 {
        self.late_dropped
    }

    fn event_time(&self) -> bool {
        self.assigner.domain == TimeDomain::EventTime
    }

    /// When the window's state goes: max timestamp + lateness (event time).
    fn cleanup_time(&self, w: &TimeWindow) -> i64 {
        if self.event_time() {
            w.max_timestamp().saturating_add(self.lateness)
        } else {
            w.max_timestamp()
        }
    }

    fn is_late(&self, w: &TimeWindow, wm: i64) -> bool {
        self.event_time() && self.cleanup_time(w) <= wm
    }

    fn register(&self, ts: i64) {
        (self.assigner.clock.register)(ts)
    }

    fn delete(&self, ts: i64) {
        (self.assigner.clock.delete)(ts)
    }

    /// Registers the firing and cleanup timers of `w`; fires it now when the
    /// watermark already passed its max timestamp (a late-but-allowed record).
    fn schedule(&mut self, key: &[u8], w: TimeWindow, ns: &[u8], wm: i64) -> Result<()> {
        if self.event_time() && w.max_timestamp() <= wm {
            self.func.fire(key, w, ns)?;
        } else {
            self.register(w.max_timestamp());
        }
        let c = self.cleanup_time(&w);
        if c != w.max_timestamp() {
            self.register(c);
        }
        Ok(())
    }

    fn late(&mut self, rec: &Record<'_>) {
        match &self.late_output {
            Some((name, emit_to)) => emit_to(name, rec.key, rec.value, rec.timestamp),
            None => self.late_dropped += 1,
        }
    }

    fn add_merging(&mut self, rec: &Record<'_>, ts: i64, wm: i64, e: &W::Elem) -> Result<()> {
        let new = self.assigner.assign(ts)[0];
        let set = sessions();
        let mut all = session_windows(&set);
        let mut merged = new;
        let mut absorbed: Vec<(TimeWindow, Vec<u8>)> = Vec::new();
        loop {
            let before = absorbed.len();
            let mut i = 0;
            while i < all.len() {
                if all[i].0.intersects(&merged) {
                    let x = all.remove(i);
                    merged = merged.cover(&x.0);
                    absorbed.push(x);
                } else {
                    i += 1;
                }
            }
            if absorbed.len() == before {
                break;
            }
        }
        if self.is_late(&merged, wm) {
            self.late(rec);
            return Ok(());
        }
        let target = match absorbed.first() {
            Some((_, ns)) => ns.clone(),
            None => merged.namespace().to_vec(),
        };
        for (w, ns) in &absorbed {
            if *ns != target {
                self.func.merge(&target, ns);
            }
            set.remove(&w.namespace().to_vec());
        }
        set.put(&merged.namespace().to_vec(), &target);
        self.func.add(&target, rec.value, e);
        // Timers of absorbed windows go unless another window (or the new one) shares their time.
        let mut keep = vec![merged.max_timestamp(), self.cleanup_time(&merged)];
        for (w, _) in &all {
            keep.push(w.max_timestamp());
            keep.push(self.cleanup_time(w));
        }
        for (w, _) in &absorbed {
            for t in [w.max_timestamp(), self.cleanup_time(w)] {
                if !keep.contains(&t) {
                    self.delete(t);
                }
            }
        }
        self.schedule(rec.key, merged, &target, wm)
    }

    /// A timer of the current key at `ts`: fires the windows whose max
    /// timestamp it is, clears those whose cleanup time it is.
    fn on_time(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        if self.assigner.is_merging() {
            let set = sessions();
            for (w, ns) in session_windows(&set) {
                if w.max_timestamp() == ts {
                    self.func.fire(key, w, &ns)?;
                }
                if self.cleanup_time(&w) == ts {
                    self.func.clear(&ns);
                    set.remove(&w.namespace().to_vec());
                }
            }
            return Ok(());
        }
        if let Some(w) = self.assigner.window_with_max(ts) {
            let ns = w.namespace();
            self.func.fire(key, w, &ns)?;
            if self.cleanup_time(&w) == ts {
                self.func.clear(&ns);
            }
        }
        if self.lateness > 0 && self.event_time() {
            if let Some(w) = ts.checked_sub(self.lateness).and_then(|t| self.assigner.window_with_max(t)) {
                self.func.clear(&w.namespace());
            }
        }
        Ok(())
    }
}

impl<W: WindowFunction> Operator for WindowOperator<W> {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let ts = if self.event_time() {
            if !rec.has_timestamp() {
                return Err(reject("window: record without a timestamp (event-time windows need event time: set the source's timestamp)"));
            }
            rec.timestamp
        } else {
            (self.assigner.clock.now)()
        };
        let e = self.func.prepare(rec.value).map_err(|e| reject(format!("window: cannot decode the record value: {}", e)))?;
        let wm = if self.event_time() { crate::current_watermark() } else { i64::MIN };
        if self.assigner.is_merging() {
            return self.add_merging(rec, ts, wm, &e);
        }
        let mut added = false;
        for w in self.assigner.assign(ts) {
            if self.is_late(&w, wm) {
                continue;
            }
            added = true;
            let ns = w.namespace();
            self.func.add(&ns, rec.value, &e);
            self.schedule(rec.key, w, &ns, wm)?;
        }
        if !added {
            self.late(rec);
        }
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        if self.event_time() {
            self.on_time(ts, key)
        } else {
            Ok(())
        }
    }

    fn on_processing_time(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        if self.event_time() {
            Ok(())
        } else {
            self.on_time(ts, key)
        }
    }

    fn finish(&mut self) -> Result<()> {
        if self.late_dropped > 0 {
            crate::log::warn(&format!("window: dropped {} late records", self.late_dropped));
        }
        Ok(())
    }
}
