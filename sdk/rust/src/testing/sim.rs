//! The simulated host behind the native `sys` imports: keyed state (v1 and
//! structured, with TTL against the simulated processing time), both kinds of
//! timers, watermarks, side outputs and operator list state, following
//! abi/ABI.md and SPEC14 as the real host does. One per thread; a
//! [`Harness`](super::Harness) swaps its own in while it calls the operator.

use super::{key_group, KeyGroupRange};
use crate::keyed::phase;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

/// The panic payload of `streamd::fail` natively: the harness turns it into
/// the operator's error.
#[derive(Debug)]
pub struct Failed(pub String);

/// A structured entry: a value, or a list of elements, each with its expiry
/// (ms of processing time; `i64::MAX` = none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    Value(Vec<u8>, i64),
    List(Vec<(Vec<u8>, i64)>),
}

/// (state name, key, namespace, user key).
pub(crate) type EntryKey = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>);

/// What a keyed write replaced, to undo a rejected batch as the host does.
#[derive(Debug)]
pub(crate) enum Undo {
    Legacy((Vec<u8>, Vec<u8>), Option<Vec<u8>>),
    Entry(EntryKey, Option<Entry>),
    ETimer((i64, Vec<u8>), bool),
    PTimer((i64, Vec<u8>), bool),
}

/// Everything the simulated host holds for one subtask.
#[derive(Debug)]
pub struct SimHost {
    pub(crate) range: KeyGroupRange,
    pub(crate) max_parallelism: u32,
    pub(crate) num_inputs: u32,
    pub(crate) allow_clock: bool,
    pub(crate) frames: Vec<Vec<u8>>,
    pub(crate) side: Vec<(String, Vec<u8>)>,
    pub(crate) legacy: BTreeMap<(Vec<u8>, Vec<u8>), Vec<u8>>,
    pub(crate) entries: BTreeMap<EntryKey, Entry>,
    /// Per state name: TTL in ms and whether reads refresh it.
    pub(crate) ttl: BTreeMap<Vec<u8>, (i64, bool)>,
    pub(crate) lists_added: Vec<(Vec<u8>, i32, Vec<u8>)>,
    pub(crate) lists_restored: BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
    pub(crate) etimers: BTreeSet<(i64, Vec<u8>)>,
    pub(crate) ptimers: BTreeSet<(i64, Vec<u8>)>,
    pub(crate) input_wms: Vec<i64>,
    pub(crate) watermark: i64,
    pub(crate) now: i64,
    pub(crate) own_watermarks: bool,
    pub(crate) watermarks_out: Vec<i64>,
    pub(crate) logs: Vec<(i32, String)>,
    pub(crate) rejects: Vec<String>,
    pub(crate) finished: bool,
    pub(crate) pending_failure: Option<String>,
    /// Set during a process call: the keyed changes to undo on a rejection.
    pub(crate) journal: Option<Vec<Undo>>,
}

impl Default for SimHost {
    fn default() -> SimHost {
        SimHost {
            range: KeyGroupRange { start: 0, end: 127 },
            max_parallelism: 128,
            num_inputs: 1,
            allow_clock: true,
            frames: Vec::new(),
            side: Vec::new(),
            legacy: BTreeMap::new(),
            entries: BTreeMap::new(),
            ttl: BTreeMap::new(),
            lists_added: Vec::new(),
            lists_restored: BTreeMap::new(),
            etimers: BTreeSet::new(),
            ptimers: BTreeSet::new(),
            input_wms: vec![i64::MIN],
            watermark: i64::MIN,
            now: 0,
            own_watermarks: false,
            watermarks_out: Vec::new(),
            logs: Vec::new(),
            rejects: Vec::new(),
            finished: false,
            pending_failure: None,
            journal: None,
        }
    }
}

thread_local! {
    static HOST: RefCell<SimHost> = RefCell::new(SimHost::default());
}

/// Runs `f` on this thread's simulated host.
pub fn with<R>(f: impl FnOnce(&mut SimHost) -> R) -> R {
    // The borrow ends before a failure unwinds: `fail` is raised outside.
    let r = HOST.with(|h| {
        let mut h = h.borrow_mut();
        h.pending_failure = None;
        let r = f(&mut h);
        (r, h.pending_failure.take())
    });
    if let Some(msg) = r.1 {
        std::panic::panic_any(Failed(msg));
    }
    r.0
}

/// Puts `h` in as this thread's host and returns the one it replaces.
pub(crate) fn swap(h: SimHost) -> SimHost {
    HOST.with(|c| std::mem::replace(&mut *c.borrow_mut(), h))
}

fn s(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl SimHost {
    /// Records a subtask failure; `with` raises it once the host is released.
    fn fail(&mut self, msg: String) {
        if self.pending_failure.is_none() {
            self.pending_failure = Some(msg);
        }
    }

    fn note_legacy(&mut self, k: &(Vec<u8>, Vec<u8>)) {
        if self.journal.is_some() {
            let prev = self.legacy.get(k).cloned();
            self.journal.as_mut().unwrap().push(Undo::Legacy(k.clone(), prev));
        }
    }

    fn note_entry(&mut self, k: &EntryKey) {
        if self.journal.is_some() {
            let prev = self.entries.get(k).cloned();
            self.journal.as_mut().unwrap().push(Undo::Entry(k.clone(), prev));
        }
    }

    fn note_timer(&mut self, processing: bool, t: &(i64, Vec<u8>)) {
        if self.journal.is_some() {
            let u = if processing { Undo::PTimer(t.clone(), self.ptimers.contains(t)) } else { Undo::ETimer(t.clone(), self.etimers.contains(t)) };
            self.journal.as_mut().unwrap().push(u);
        }
    }

    /// Undoes the journaled changes, newest first.
    pub(crate) fn undo(&mut self, journal: Vec<Undo>) {
        fn set<K: Ord, V>(m: &mut BTreeMap<K, V>, k: K, v: Option<V>) {
            match v {
                Some(v) => {
                    m.insert(k, v);
                }
                None => {
                    m.remove(&k);
                }
            }
        }
        fn mark<T: Ord>(s: &mut BTreeSet<T>, t: T, present: bool) {
            if present {
                s.insert(t);
            } else {
                s.remove(&t);
            }
        }
        for u in journal.into_iter().rev() {
            match u {
                Undo::Legacy(k, v) => set(&mut self.legacy, k, v),
                Undo::Entry(k, v) => set(&mut self.entries, k, v),
                Undo::ETimer(t, p) => mark(&mut self.etimers, t, p),
                Undo::PTimer(t, p) => mark(&mut self.ptimers, t, p),
            }
        }
    }

    fn writes_allowed(&mut self, what: &str) -> bool {
        let p = phase();
        if p == "close" || (self.finished && (p == "snapshot_state" || p == "notify_checkpoint_complete")) {
            self.fail(format!("{} is not allowed in {}{}", what, p, if p == "close" { "" } else { " after finish" }));
            return false;
        }
        true
    }

    fn key_ok(&mut self, what: &str, key: &[u8]) -> bool {
        if key.is_empty() {
            self.fail(format!("{}: empty key", what));
            return false;
        }
        let kg = key_group(key, self.max_parallelism);
        if !self.range.contains(kg) {
            self.fail(format!("{}: key {:?} is in key group {}, not in this subtask's range {}", what, s(key), kg, self.range));
            return false;
        }
        true
    }

    fn expiry(&self, name: &[u8]) -> i64 {
        match self.ttl.get(name) {
            Some(&(ms, _)) if ms > 0 => self.now.saturating_add(ms),
            _ => i64::MAX,
        }
    }

    fn refresh_on_read(&self, name: &[u8]) -> Option<i64> {
        match self.ttl.get(name) {
            Some(&(ms, true)) if ms > 0 => Some(self.now.saturating_add(ms)),
            _ => None,
        }
    }

    pub(crate) fn emit(&mut self, frame: &[u8]) {
        let p = phase();
        if matches!(p, "open" | "snapshot_state" | "notify_checkpoint_complete" | "close") {
            return self.fail(format!("emit is not allowed in {}", p));
        }
        self.frames.push(frame.to_vec())
    }

    pub(crate) fn emit_to(&mut self, name: &[u8], frame: &[u8]) {
        let p = phase();
        if matches!(p, "open" | "snapshot_state" | "notify_checkpoint_complete" | "close") {
            return self.fail(format!("emit_to is not allowed in {}", p));
        }
        self.side.push((s(name), frame.to_vec()))
    }

    fn v1_name_ok(&mut self, name: &[u8]) -> bool {
        if name.first() == Some(&0) {
            self.fail(format!("state {:?}: names starting with a NUL byte are reserved", s(name)));
            return false;
        }
        true
    }

    pub(crate) fn state_get(&mut self, name: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        if !self.v1_name_ok(name) || !self.key_ok(&format!("state {:?}", s(name)), key) {
            return None;
        }
        self.legacy.get(&(name.to_vec(), key.to_vec())).cloned()
    }
    pub(crate) fn state_put(&mut self, name: &[u8], key: &[u8], value: &[u8]) {
        if self.v1_name_ok(name) && self.writes_allowed("state_put") && self.key_ok(&format!("state {:?}", s(name)), key) {
            let k = (name.to_vec(), key.to_vec());
            self.note_legacy(&k);
            self.legacy.insert(k, value.to_vec());
        }
    }
    pub(crate) fn state_delete(&mut self, name: &[u8], key: &[u8]) {
        if self.v1_name_ok(name) && self.writes_allowed("state_delete") && self.key_ok(&format!("state {:?}", s(name)), key) {
            let k = (name.to_vec(), key.to_vec());
            self.note_legacy(&k);
            self.legacy.remove(&k);
        }
    }
    pub(crate) fn list_state_add(&mut self, name: &[u8], mode: i32, value: &[u8]) {
        if phase() != "snapshot_state" {
            return self.fail(format!("list_state_add is only allowed in snapshot_state, not in {}", phase()));
        }
        if let Some((_, m, _)) = self.lists_added.iter().find(|(n, _, _)| n == name) {
            if *m != mode {
                return self.fail(format!("list state {:?}: mode {} after mode {}", s(name), mode, m));
            }
        }
        self.lists_added.push((name.to_vec(), mode, value.to_vec()))
    }
    pub(crate) fn list_state_get(&mut self, name: &[u8], index: i32) -> Option<Vec<u8>> {
        self.lists_restored.get(name).and_then(|l| l.get(index as usize)).cloned()
    }
    pub(crate) fn timer_register(&mut self, key: &[u8], ts: i64) {
        if self.writes_allowed("timer_register") && self.key_ok("timer_register", key) {
            let t = (ts, key.to_vec());
            self.note_timer(false, &t);
            self.etimers.insert(t);
        }
    }
    pub(crate) fn timer_delete(&mut self, key: &[u8], ts: i64) {
        if self.writes_allowed("timer_delete") && self.key_ok("timer_delete", key) {
            let t = (ts, key.to_vec());
            self.note_timer(false, &t);
            self.etimers.remove(&t);
        }
    }
    pub(crate) fn ptimer_register(&mut self, key: &[u8], ts: i64) {
        if self.writes_allowed("ptimer_register") && self.key_ok("ptimer_register", key) {
            let t = (ts, key.to_vec());
            self.note_timer(true, &t);
            self.ptimers.insert(t);
        }
    }
    pub(crate) fn ptimer_delete(&mut self, key: &[u8], ts: i64) {
        if self.writes_allowed("ptimer_delete") && self.key_ok("ptimer_delete", key) {
            let t = (ts, key.to_vec());
            self.note_timer(true, &t);
            self.ptimers.remove(&t);
        }
    }
    pub(crate) fn current_watermark(&mut self) -> i64 {
        self.watermark
    }
    pub(crate) fn processing_time(&mut self) -> i64 {
        if !self.allow_clock {
            self.fail("processing_time needs allow_clock: true (job file)".to_string());
            return 0;
        }
        self.now
    }
    pub(crate) fn emit_watermark(&mut self, ts: i64) {
        let p = phase();
        // SPEC14: open, process, on_watermark, on_timer, on_processing_time, end_input.
        if matches!(p, "finish" | "snapshot_state" | "notify_checkpoint_complete" | "close") {
            return self.fail(format!("emit_watermark is not allowed in {}", p));
        }
        self.own_watermarks = true;
        if self.watermarks_out.last().map_or(true, |&l| ts > l) {
            self.watermarks_out.push(ts)
        }
    }
    pub(crate) fn input_watermark(&mut self, input: i32) -> i64 {
        match self.input_wms.get(input as usize) {
            Some(&w) if input >= 0 => w,
            _ => {
                self.fail(format!("input_watermark: input {} out of range (the operator has {} inputs)", input, self.num_inputs));
                i64::MIN
            }
        }
    }
    pub(crate) fn log(&mut self, level: i32, msg: &str) {
        self.logs.push((level, msg.to_string()))
    }
    pub(crate) fn reject(&mut self, msg: &str) {
        self.rejects.push(msg.to_string())
    }

    pub(crate) fn state_ttl(&mut self, name: &[u8], ttl_ms: i64, flags: i32) {
        if phase() != "open" {
            return self.fail(format!("state_ttl is only allowed in open, not in {}", phase()));
        }
        self.ttl.insert(name.to_vec(), (ttl_ms, flags & 1 != 0));
    }

    fn ekey(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8]) -> EntryKey {
        (name.to_vec(), key.to_vec(), ns.to_vec(), ukey.to_vec())
    }

    /// The live value of an entry as `mstate_get` returns it; drops what expired.
    fn read_entry(&mut self, k: &EntryKey) -> Option<Vec<u8>> {
        let now = self.now;
        let refresh = self.refresh_on_read(&k.0);
        if !self.entries.contains_key(k) {
            return None;
        }
        self.note_entry(k); // reads refresh expiries and drop expired elements
        let e = self.entries.get_mut(k)?;
        let out = match e {
            Entry::Value(v, exp) => {
                if *exp <= now {
                    None
                } else {
                    if let Some(r) = refresh {
                        *exp = r;
                    }
                    Some(v.clone())
                }
            }
            Entry::List(els) => {
                els.retain(|(_, exp)| *exp > now);
                if els.is_empty() {
                    None
                } else {
                    let mut f = (els.len() as u32).to_le_bytes().to_vec();
                    for (v, exp) in els.iter_mut() {
                        if let Some(r) = refresh {
                            *exp = r;
                        }
                        f.extend_from_slice(&(v.len() as u32).to_le_bytes());
                        f.extend_from_slice(v);
                    }
                    Some(f)
                }
            }
        };
        if out.is_none() {
            self.entries.remove(k);
        }
        out
    }

    fn structured_ok(&mut self, what: &str, name: &[u8], key: &[u8], write: bool) -> bool {
        (!write || self.writes_allowed(what)) && self.key_ok(&format!("state {:?}", s(name)), key)
    }

    pub(crate) fn mstate_get(&mut self, name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8]) -> Option<Vec<u8>> {
        if !self.structured_ok("mstate_get", name, key, false) {
            return None;
        }
        self.read_entry(&Self::ekey(name, key, ns, ukey))
    }
    pub(crate) fn mstate_put(&mut self, name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8], value: &[u8]) {
        if self.structured_ok("mstate_put", name, key, true) {
            let exp = self.expiry(name);
            let k = Self::ekey(name, key, ns, ukey);
            self.note_entry(&k);
            self.entries.insert(k, Entry::Value(value.to_vec(), exp));
        }
    }
    pub(crate) fn mstate_append(&mut self, name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8], value: &[u8]) {
        if !self.structured_ok("mstate_append", name, key, true) {
            return;
        }
        let (exp, now) = (self.expiry(name), self.now);
        let k = Self::ekey(name, key, ns, ukey);
        self.note_entry(&k);
        match self.entries.get_mut(&k) {
            Some(Entry::Value(_, e)) if *e > now => self.fail(format!("state {}: entry is a value, not a list", s(name))),
            Some(Entry::List(els)) => els.push((value.to_vec(), exp)),
            _ => {
                self.entries.insert(k, Entry::List(vec![(value.to_vec(), exp)]));
            }
        }
    }
    pub(crate) fn mstate_remove(&mut self, name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8]) {
        if self.structured_ok("mstate_remove", name, key, true) {
            let k = Self::ekey(name, key, ns, ukey);
            self.note_entry(&k);
            self.entries.remove(&k);
        }
    }
    fn prefix(&self, name: &[u8], key: &[u8], ns: &[u8]) -> Vec<EntryKey> {
        let lo = Self::ekey(name, key, ns, b"");
        self.entries
            .range(lo..)
            .take_while(|(k, _)| k.0 == name && k.1 == key && k.2 == ns)
            .map(|(k, _)| k.clone())
            .collect()
    }
    pub(crate) fn mstate_entries(&mut self, name: &[u8], key: &[u8], ns: &[u8]) -> Option<Vec<u8>> {
        if !self.structured_ok("mstate_entries", name, key, false) {
            return None;
        }
        let mut n = 0u32;
        let mut f = vec![0, 0, 0, 0];
        for k in self.prefix(name, key, ns) {
            if let Some(v) = self.read_entry(&k) {
                n += 1;
                f.extend_from_slice(&(k.3.len() as u32).to_le_bytes());
                f.extend_from_slice(&k.3);
                f.extend_from_slice(&(v.len() as u32).to_le_bytes());
                f.extend_from_slice(&v);
            }
        }
        if n == 0 {
            return None;
        }
        f[..4].copy_from_slice(&n.to_le_bytes());
        Some(f)
    }
    pub(crate) fn mstate_clear(&mut self, name: &[u8], key: &[u8], ns: &[u8]) {
        if self.structured_ok("mstate_clear", name, key, true) {
            for k in self.prefix(name, key, ns) {
                self.note_entry(&k);
                self.entries.remove(&k);
            }
        }
    }

    /// Drops every expired entry and list element (as the memory backend does
    /// when it writes a snapshot).
    pub(crate) fn drop_expired(&mut self) {
        let now = self.now;
        self.entries.retain(|_, e| match e {
            Entry::Value(_, exp) => *exp > now,
            Entry::List(els) => {
                els.retain(|(_, exp)| *exp > now);
                !els.is_empty()
            }
        });
    }
}
