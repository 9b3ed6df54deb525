//! A native test harness for operators (SPEC14 section 4): no Wasm, no host
//! process. [`Harness`] drives an [`Operator`] through its lifecycle against a
//! simulated host that keeps keyed state (with TTL against the harness's
//! processing time), event-time and processing-time timers, watermarks, side
//! outputs and operator list state as abi/ABI.md and SPEC14 describe, and
//! captures what the operator emits.
//!
//! ```ignore
//! use streamd::testing::{Harness, Options};
//! let mut h = Harness::new(MyOp::default(), Options::default());
//! h.open()?;
//! h.process_element(&Record::new(b"k", b"v", 10), 0)?;
//! h.process_watermark(100)?;            // fires event-time timers, then on_watermark
//! assert_eq!(h.output()[0].value, b"...");
//! let snap = h.snapshot(1)?;            // restore: Options { restore: vec![snap], .. }
//! ```
//!
//! Only one harness runs operator code at a time per thread (each swaps its
//! simulated host in for the call), so several harnesses in one test (e.g.
//! a job rescaled from 2 subtasks to 3) work.

#[doc(hidden)]
pub mod sim;

use crate::frame::{decode_records_owned, encode_batch};
use crate::helpers::OwnedRecord;
use crate::{emit, Batch, Context, Error, Operator, Record, Result};
use sim::{Entry, EntryKey, Failed, SimHost};
use std::collections::BTreeMap;
use std::fmt;

/// The 32-bit key hash of abi/keygroup.go: FNV-1a, then murmur3's finalizer.
pub fn key_hash(key: &[u8]) -> u32 {
    let mut h: u32 = 2166136261;
    for &c in key {
        h ^= c as u32;
        h = h.wrapping_mul(16777619);
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0x85ebca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2ae35);
    h ^= h >> 16;
    h
}

/// The key group of `key` among `max_parallelism` groups.
pub fn key_group(key: &[u8], max_parallelism: u32) -> u32 {
    key_hash(key) % max_parallelism
}

/// The subtask (of `parallelism`) that owns `key`: where a hash edge sends it.
pub fn subtask_for_key(key: &[u8], max_parallelism: u32, parallelism: u32) -> u32 {
    (key_group(key, max_parallelism) as u64 * parallelism as u64 / max_parallelism as u64) as u32
}

/// The inclusive range of key groups of a subtask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyGroupRange {
    /// First key group.
    pub start: u32,
    /// Last key group (inclusive).
    pub end: u32,
}

impl KeyGroupRange {
    /// The key groups subtask `subtask` of `parallelism` owns.
    pub fn for_subtask(subtask: u32, max_parallelism: u32, parallelism: u32) -> KeyGroupRange {
        let (i, m, p) = (subtask as u64, max_parallelism as u64, parallelism as u64);
        KeyGroupRange { start: ((i * m + p - 1) / p) as u32, end: (((i + 1) * m - 1) / p) as u32 }
    }

    /// Whether `kg` is in the range.
    pub fn contains(&self, kg: u32) -> bool {
        kg >= self.start && kg <= self.end
    }
}

impl fmt::Display for KeyGroupRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{},{}]", self.start, self.end)
    }
}

/// How a harness is set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// 0-based subtask index.
    pub subtask: u32,
    /// Number of subtasks.
    pub parallelism: u32,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Number of inputs.
    pub num_inputs: u32,
    /// The operator's config (job file `config`).
    pub config: Vec<(String, String)>,
    /// Whether `current_processing_time` is allowed (job file `allow_clock`).
    /// Processing-time timers and TTL work without it.
    pub allow_clock: bool,
    /// The processing time at the start (ms); after a restore at least the
    /// latest snapshot's.
    pub processing_time: i64,
    /// Snapshots of the subtasks of an earlier run to restore from (all of
    /// them, at any parallelism): this subtask takes the keyed state and
    /// timers of its key groups and its share of the operator list state.
    pub restore: Vec<Snapshot>,
    /// Job name in the open context.
    pub job: String,
    /// Operator uid in the open context.
    pub operator: String,
    /// Attempt in the open context.
    pub attempt: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            subtask: 0,
            parallelism: 1,
            max_parallelism: 128,
            num_inputs: 1,
            config: Vec::new(),
            allow_clock: false,
            processing_time: 0,
            restore: Vec::new(),
            job: "test".into(),
            operator: "op".into(),
            attempt: 0,
        }
    }
}

/// What a checkpoint of one subtask holds: keyed state (v1 values and
/// structured entries with their expiries), both kinds of timers and the
/// operator list state written in `snapshot_state`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The checkpoint id.
    pub checkpoint_id: i64,
    /// The subtask that wrote it.
    pub subtask: u32,
    /// Its parallelism.
    pub parallelism: u32,
    /// The harness's processing time when it was taken; a restore starts at
    /// least there (TTL expiries and processing-time timers are on that clock).
    pub processing_time: i64,
    legacy: Vec<((Vec<u8>, Vec<u8>), Vec<u8>)>,
    entries: Vec<(EntryKey, Entry)>,
    etimers: Vec<(i64, Vec<u8>)>,
    ptimers: Vec<(i64, Vec<u8>)>,
    /// Operator list state: name, mode, entries.
    lists: Vec<(Vec<u8>, i32, Vec<Vec<u8>>)>,
}

impl Snapshot {
    /// Number of keyed entries (v1 values plus structured entries).
    pub fn keyed_entries(&self) -> usize {
        self.legacy.len() + self.entries.len()
    }
    /// Number of timers (both kinds).
    pub fn timers(&self) -> usize {
        self.etimers.len() + self.ptimers.len()
    }
}

/// Drives one operator subtask natively. Methods follow the host's order of
/// lifecycle calls; after a failure (an `Err`, a panic, `fail`) every later
/// call returns an error and `close` is not called (as the host does).
pub struct Harness<T: Operator> {
    op: T,
    opts: Options,
    host: SimHost,
    output: Vec<OwnedRecord>,
    side: BTreeMap<String, Vec<OwnedRecord>>,
    failed: Option<Error>,
    opened: bool,
    closed: bool,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(f) = p.downcast_ref::<Failed>() {
        return f.0.clone();
    }
    let msg = if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-text panic)".to_string()
    };
    format!("panicked: {}", msg)
}

impl<T: Operator> Harness<T> {
    /// A harness for `op`; nothing runs before [`Harness::open`].
    pub fn new(op: T, opts: Options) -> Harness<T> {
        assert!(opts.parallelism >= 1 && opts.subtask < opts.parallelism, "harness: subtask {} of parallelism {}", opts.subtask, opts.parallelism);
        assert!(opts.max_parallelism >= opts.parallelism, "harness: max_parallelism below parallelism");
        let mut host = SimHost {
            range: KeyGroupRange::for_subtask(opts.subtask, opts.max_parallelism, opts.parallelism),
            max_parallelism: opts.max_parallelism,
            num_inputs: opts.num_inputs,
            allow_clock: opts.allow_clock,
            input_wms: vec![i64::MIN; opts.num_inputs.max(1) as usize],
            now: opts.processing_time,
            ..SimHost::default()
        };
        restore_into(&mut host, &opts);
        Harness { op, opts, host, output: Vec::new(), side: BTreeMap::new(), failed: None, opened: false, closed: false }
    }

    /// The operator.
    pub fn operator(&self) -> &T {
        &self.op
    }

    /// The operator, mutable.
    pub fn operator_mut(&mut self) -> &mut T {
        &mut self.op
    }

    /// Runs one lifecycle call as the SDK's exports do: phase, current key,
    /// output flushed on success and dropped on failure.
    fn call(&mut self, phase: &'static str, key: Option<&[u8]>, f: impl FnOnce(&mut T) -> Result<()>) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(Error::new(format!("harness: the operator failed earlier: {}", e)));
        }
        if self.closed {
            return Err(Error::new(format!("harness: {} after close", phase)));
        }
        if !self.opened && phase != "open" {
            return Err(Error::new(format!("harness: {} before open", phase)));
        }
        self.host.journal = if phase == "process" { Some(Vec::new()) } else { None };
        let prev = sim::swap(std::mem::take(&mut self.host));
        let op = &mut self.op;
        // The output is flushed in the call's phase, so the host sees where it was emitted.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::__rt::run(phase, key, || {
                let r = f(op);
                if r.is_ok() {
                    emit::flush();
                }
                r
            })
        }));
        let r = match r {
            Ok(r) => r,
            Err(p) => Err(Error::new(panic_message(p))),
        };
        let r = match r {
            Ok(()) => Ok(()),
            Err(e) => {
                emit::discard();
                if phase == "process" && e.is_rejection() {
                    sim::with(|h| h.reject(e.message()));
                }
                Err(e)
            }
        };
        self.host = sim::swap(prev);
        if let Some(j) = self.host.journal.take() {
            if matches!(&r, Err(e) if e.is_rejection()) {
                self.host.undo(j); // the host replays the batch without the record
            }
        }
        for f in std::mem::take(&mut self.host.frames) {
            self.output.extend(decode_records_owned(&f).expect("harness: the SDK emitted a malformed frame"));
        }
        for (name, f) in std::mem::take(&mut self.host.side) {
            let out = self.side.entry(name).or_default();
            out.extend(decode_records_owned(&f).expect("harness: the SDK emitted a malformed side frame"));
        }
        if let Err(e) = &r {
            if !e.is_rejection() || phase != "process" {
                self.failed = Some(e.clone());
            }
        }
        r
    }

    /// `open` with the context the options describe (restored when
    /// `Options::restore` is not empty).
    pub fn open(&mut self) -> Result<()> {
        if self.opened {
            return Err(Error::new("harness: open twice"));
        }
        let ctx = Context {
            subtask: self.opts.subtask,
            parallelism: self.opts.parallelism,
            max_parallelism: self.opts.max_parallelism,
            attempt: self.opts.attempt,
            num_inputs: self.opts.num_inputs,
            restored: !self.opts.restore.is_empty(),
            job: self.opts.job.clone(),
            operator: self.opts.operator.clone(),
            config: self.opts.config.clone(),
        };
        self.opened = true;
        self.call("open", None, |op| op.open(&ctx))
    }

    fn check_input(&self, input: u32) -> Result<()> {
        if input >= self.opts.num_inputs {
            return Err(Error::new(format!("harness: input {} out of range ({} inputs)", input, self.opts.num_inputs)));
        }
        Ok(())
    }

    /// One record of input `input`, passed as a batch of one (so an operator's
    /// own `process_batch` runs too). Its key must belong to this subtask.
    pub fn process_element(&mut self, rec: &Record<'_>, input: u32) -> Result<()> {
        self.process_batch(core::slice::from_ref(rec), input)
    }

    /// A batch of records of input `input`. When a record is rejected, the
    /// batch is undone (output, keyed state, timers) and its records run one
    /// by one, as the host replays it without the rejected record; the first
    /// rejection is returned.
    pub fn process_batch(&mut self, recs: &[Record<'_>], input: u32) -> Result<()> {
        self.check_input(input)?;
        if self.host.finished {
            return Err(Error::new("harness: process after finish"));
        }
        for r in recs {
            if r.has_key() && !self.host.range.contains(key_group(r.key, self.opts.max_parallelism)) {
                return Err(Error::new(format!(
                    "harness: key {:?} belongs to subtask {}, not {} (route records with testing::subtask_for_key)",
                    String::from_utf8_lossy(r.key),
                    subtask_for_key(r.key, self.opts.max_parallelism, self.opts.parallelism),
                    self.opts.subtask
                )));
            }
        }
        let frame = encode_batch(recs);
        let batch = Batch::parse(&frame).expect("harness: encode_batch made a valid frame");
        match self.call("process", None, |op| op.process_batch(&batch, input)) {
            Err(e) if e.is_rejection() && recs.len() > 1 => {
                // As the host: the batch is undone, then each record runs alone, so
                // only the rejected ones are left out. The first rejection is returned.
                self.host.rejects.pop();
                let mut first = None;
                for r in recs {
                    match self.process_batch(core::slice::from_ref(r), input) {
                        Err(e) if e.is_rejection() => {
                            first.get_or_insert(e);
                        }
                        Err(e) => return Err(e),
                        Ok(()) => {}
                    }
                }
                first.map_or(Ok(()), Err)
            }
            r => r,
        }
    }

    /// The watermark of every input advances to `ts`: due event-time timers
    /// fire (`on_timer`, in (ts, key) order), then `on_watermark(ts)`; unless
    /// the operator emits its own watermarks, `ts` is forwarded downstream. A
    /// watermark not above the current one does nothing.
    pub fn process_watermark(&mut self, ts: i64) -> Result<()> {
        for w in self.host.input_wms.iter_mut() {
            *w = (*w).max(ts);
        }
        self.advance(ts)
    }

    /// Only input `input`'s watermark advances to `ts`; the operator's
    /// watermark is the minimum over its inputs.
    pub fn process_watermark_of(&mut self, input: u32, ts: i64) -> Result<()> {
        self.check_input(input)?;
        let w = &mut self.host.input_wms[input as usize];
        *w = (*w).max(ts);
        let min = self.host.input_wms.iter().copied().min().unwrap_or(ts);
        self.advance(min)
    }

    fn advance(&mut self, ts: i64) -> Result<()> {
        if ts <= self.host.watermark {
            return Ok(());
        }
        self.host.watermark = ts;
        // Timers registered while these fire (even at or below ts) wait for the next advance.
        let due: Vec<(i64, Vec<u8>)> = self.host.etimers.iter().take_while(|(t, _)| *t <= ts).cloned().collect();
        for t in due {
            if !self.host.etimers.remove(&t) {
                continue; // deleted by an earlier on_timer
            }
            let (tts, key) = t;
            self.call("on_timer", Some(&key), |op| op.on_timer(tts, &key))?;
        }
        self.call("on_watermark", None, |op| op.on_watermark(ts))?;
        if !self.host.own_watermarks && self.host.watermarks_out.last().map_or(true, |&l| ts > l) {
            self.host.watermarks_out.push(ts);
        }
        Ok(())
    }

    /// Processing time advances to `ts` (it never goes back; the same `ts`
    /// again is allowed): due processing-time timers fire
    /// (`on_processing_time`, in (ts, key) order; those registered meanwhile
    /// wait for the next call, as on the host), and TTL'd state expires.
    pub fn set_processing_time(&mut self, ts: i64) -> Result<()> {
        if ts < self.host.now {
            return Err(Error::new(format!("harness: processing time {} before the current {}", ts, self.host.now)));
        }
        self.host.now = ts;
        if self.host.finished || !self.opened {
            return Ok(());
        }
        // As the host: timers registered while these fire wait for the next call, even if due.
        let due: Vec<(i64, Vec<u8>)> = self.host.ptimers.iter().take_while(|(t, _)| *t <= ts).cloned().collect();
        for t in due {
            if !self.host.ptimers.remove(&t) {
                continue; // deleted by an earlier on_processing_time
            }
            let (tts, key) = t;
            self.call("on_processing_time", Some(&key), |op| op.on_processing_time(tts, &key))?;
        }
        Ok(())
    }

    /// Input `input` ended (end of data with drain).
    pub fn end_input(&mut self, input: u32) -> Result<()> {
        self.check_input(input)?;
        self.call("end_input", None, |op| op.end_input(input))
    }

    /// `finish`; afterwards pending processing-time timers are dropped and
    /// the MAX watermark goes downstream.
    pub fn finish(&mut self) -> Result<()> {
        self.call("finish", None, |op| op.finish())?;
        self.host.finished = true;
        self.host.ptimers.clear();
        if self.host.watermarks_out.last() != Some(&crate::MAX_WATERMARK) {
            self.host.watermarks_out.push(crate::MAX_WATERMARK);
        }
        Ok(())
    }

    /// A checkpoint: `snapshot_state(id)`, then the subtask's keyed state,
    /// timers and operator list state (expired entries are dropped first, as
    /// the memory backend does).
    pub fn snapshot(&mut self, checkpoint_id: i64) -> Result<Snapshot> {
        self.host.lists_added.clear();
        self.call("snapshot_state", None, |op| op.snapshot_state(checkpoint_id))?;
        let h = &mut self.host;
        h.drop_expired();
        let mut lists: Vec<(Vec<u8>, i32, Vec<Vec<u8>>)> = Vec::new();
        for (name, mode, v) in h.lists_added.drain(..) {
            match lists.iter_mut().find(|l| l.0 == name) {
                Some(l) => l.2.push(v),
                None => lists.push((name, mode, vec![v])),
            }
        }
        Ok(Snapshot {
            checkpoint_id,
            subtask: self.opts.subtask,
            parallelism: self.opts.parallelism,
            processing_time: h.now,
            legacy: h.legacy.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            entries: h.entries.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            etimers: h.etimers.iter().cloned().collect(),
            ptimers: h.ptimers.iter().cloned().collect(),
            lists,
        })
    }

    /// `notify_checkpoint_complete(id)`.
    pub fn notify_checkpoint_complete(&mut self, checkpoint_id: i64) -> Result<()> {
        self.call("notify_checkpoint_complete", None, |op| op.notify_checkpoint_complete(checkpoint_id))
    }

    /// `close`, the last call; refused after a failure (the host does not
    /// call close then).
    pub fn close(&mut self) -> Result<()> {
        let r = self.call("close", None, |op| op.close());
        self.closed = true;
        r
    }

    /// Whether a call failed (the operator is dead).
    pub fn failure(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    /// Every record emitted downstream so far.
    pub fn output(&self) -> &[OwnedRecord] {
        &self.output
    }

    /// Every record emitted to side output `name` so far.
    pub fn side_output(&self, name: &str) -> &[OwnedRecord] {
        self.side.get(name).map_or(&[], |v| v.as_slice())
    }

    /// The watermarks sent downstream: the forwarded input watermark, or
    /// the operator's own from its first `emit_watermark` on; MAX after finish.
    pub fn emitted_watermarks(&self) -> &[i64] {
        &self.host.watermarks_out
    }

    /// Forgets the captured output, side outputs and watermarks.
    pub fn clear_output(&mut self) {
        self.output.clear();
        self.side.clear();
        self.host.watermarks_out.clear();
    }

    /// The current (combined) watermark.
    pub fn current_watermark(&self) -> i64 {
        self.host.watermark
    }

    /// The current processing time.
    pub fn processing_time(&self) -> i64 {
        self.host.now
    }

    /// Pending event-time timers, in firing order.
    pub fn event_timers(&self) -> Vec<(i64, Vec<u8>)> {
        self.host.etimers.iter().cloned().collect()
    }

    /// Pending processing-time timers, in firing order.
    pub fn processing_timers(&self) -> Vec<(i64, Vec<u8>)> {
        self.host.ptimers.iter().cloned().collect()
    }

    /// Number of live keyed entries (v1 values and structured entries).
    pub fn keyed_state_len(&self) -> usize {
        let now = self.host.now;
        let live = self
            .host
            .entries
            .values()
            .filter(|e| match e {
                Entry::Value(_, exp) => *exp > now,
                Entry::List(els) => els.iter().any(|(_, exp)| *exp > now),
            })
            .count();
        self.host.legacy.len() + live
    }

    /// Log lines the operator wrote: (level, message).
    pub fn logs(&self) -> &[(i32, String)] {
        &self.host.logs
    }

    /// Reasons of the records the operator rejected.
    pub fn rejections(&self) -> &[String] {
        &self.host.rejects
    }
}

/// Fills a fresh host from `opts.restore`: keyed state and timers of the
/// subtask's key groups, list state by mode (split: round robin over the
/// entries of all old subtasks in subtask order; union: all; broadcast: the
/// first old subtask's).
fn restore_into(h: &mut SimHost, opts: &Options) {
    let mine = |key: &[u8]| h.range.contains(key_group(key, opts.max_parallelism));
    let mut legacy = Vec::new();
    let mut entries = Vec::new();
    let mut et = Vec::new();
    let mut pt = Vec::new();
    let mut lists: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    let mut split_seen: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    let mut snaps: Vec<&Snapshot> = opts.restore.iter().collect();
    snaps.sort_by_key(|s| s.subtask);
    for (si, s) in snaps.iter().enumerate() {
        h.now = h.now.max(s.processing_time);
        legacy.extend(s.legacy.iter().filter(|((_, k), _)| mine(k)).cloned());
        entries.extend(s.entries.iter().filter(|(k, _)| mine(&k.1)).cloned());
        et.extend(s.etimers.iter().filter(|(_, k)| mine(k)).cloned());
        pt.extend(s.ptimers.iter().filter(|(_, k)| mine(k)).cloned());
        for (name, mode, vals) in &s.lists {
            let l = lists.entry(name.clone()).or_default();
            match mode {
                0 => {
                    let seen = split_seen.entry(name.clone()).or_default();
                    for v in vals {
                        if *seen % opts.parallelism as usize == opts.subtask as usize {
                            l.push(v.clone());
                        }
                        *seen += 1;
                    }
                }
                2 if si > 0 => {}
                _ => l.extend(vals.iter().cloned()),
            }
        }
    }
    h.legacy.extend(legacy);
    h.entries.extend(entries);
    h.etimers.extend(et);
    h.ptimers.extend(pt);
    h.lists_restored = lists;
    // TTL settings come from the new run's open (state_ttl); expiries stay with the entries.
}
