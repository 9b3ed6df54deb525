//! Tests of keyed state, timers, watermarks and side outputs through the
//! native harness (streamd::testing), which simulates the host as SPEC14 says.

use crate::testing::{key_group, key_hash, subtask_for_key, Harness, KeyGroupRange, Options, Snapshot};
use crate::*;

fn s(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn outs(h: &Harness<impl Operator>) -> Vec<(String, String, i64)> {
    h.output().iter().map(|r| (s(&r.key), s(&r.value), r.timestamp)).collect()
}

#[test]
fn key_hash_matches_abi_keygroup_go() {
    // Values printed by abi.KeyHash / KeyGroup / SubtaskForKeyGroup / RangeForSubtask.
    assert_eq!(key_hash(b"a"), 444641715);
    assert_eq!(key_hash(b"hello"), 2290972270);
    assert_eq!(key_hash(b"key-42"), 3239141685);
    assert_eq!(key_hash(b""), 2872998923);
    assert_eq!(key_group(b"hello", 128), 110);
    assert_eq!(subtask_for_key(b"hello", 128, 3), 2);
    assert_eq!(subtask_for_key(b"a", 128, 3), 1);
    assert_eq!(KeyGroupRange::for_subtask(1, 128, 3), KeyGroupRange { start: 43, end: 85 });
}

/// Counts per key in all kinds of state; "timer:N" registers timers.
#[derive(Default)]
struct Counter {
    closed: bool,
}

const COUNT: ValueState<I64> = ValueState::new("count");
const SEEN: ListState<Str> = ListState::new("seen");
const BY_VALUE: MapState<Str, I64> = MapState::new("by-value");

impl Operator for Counter {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let v = std::str::from_utf8(rec.value)?.to_string();
        if let Some(t) = v.strip_prefix("etimer:") {
            timer::register_event_time(t.parse()?);
            return Ok(());
        }
        if let Some(t) = v.strip_prefix("ptimer:") {
            timer::register_processing_time(t.parse()?);
            return Ok(());
        }
        if v == "fail" {
            return Err("asked to fail".into());
        }
        let n = COUNT.get().unwrap_or(0) + 1;
        COUNT.set(&n);
        SEEN.add(&v);
        BY_VALUE.put(&v, &(BY_VALUE.get(&v).unwrap_or(0) + 1));
        assert_eq!(current_key().as_deref(), Some(rec.key));
        emit(rec.key, format!("{}", n).as_bytes(), rec.timestamp);
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        let seen = SEEN.get().join(",");
        let map: Vec<String> = BY_VALUE.entries().into_iter().map(|(k, v)| format!("{}={}", k, v)).collect();
        emit(key, format!("etimer {} count={} seen={} map={}", ts, COUNT.get().unwrap_or(0), seen, map.join(";")).as_bytes(), ts);
        Ok(())
    }

    fn on_processing_time(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        emit(key, format!("ptimer {} count={}", ts, COUNT.get().unwrap_or(0)).as_bytes(), ts);
        Ok(())
    }

    fn on_watermark(&mut self, ts: i64) -> Result<()> {
        if ts == 999 {
            COUNT.get(); // no current key here: fails the subtask
        }
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        self.closed = true;
        Ok(())
    }
}

fn rec<'a>(k: &'a str, v: &'a str, ts: i64) -> Record<'a> {
    Record::new(k.as_bytes(), v.as_bytes(), ts)
}

#[test]
fn state_of_the_current_key_and_timers() {
    let mut h = Harness::new(Counter::default(), Options::default());
    h.open().unwrap();
    for r in [rec("a", "x", 1), rec("b", "y", 2), rec("a", "y", 3), rec("a", "x", 4), rec("a", "etimer:10", 5), rec("b", "etimer:5", 5)] {
        h.process_element(&r, 0).unwrap();
    }
    assert_eq!(h.event_timers(), vec![(5, b"b".to_vec()), (10, b"a".to_vec())]);
    h.process_watermark(7).unwrap();
    h.process_watermark(7).unwrap(); // not above: nothing
    h.process_watermark(10).unwrap();
    let got = outs(&h);
    assert_eq!(got[..4].iter().map(|o| o.1.as_str()).collect::<Vec<_>>(), vec!["1", "1", "2", "3"]);
    assert_eq!(got[4], ("b".into(), "etimer 5 count=1 seen=y map=y=1".into(), 5));
    assert_eq!(got[5], ("a".into(), "etimer 10 count=3 seen=x,y,x map=x=2;y=1".into(), 10));
    assert_eq!(h.emitted_watermarks(), &[7, 10]);
    // No current key in on_watermark: the subtask fails with the state's name and the phase.
    let e = h.process_watermark(999).unwrap_err();
    assert!(e.message().contains("state \"count\": no current key in on_watermark"), "{}", e);
    assert!(h.process_element(&rec("a", "x", 1), 0).is_err());
    assert!(h.close().is_err());
    assert!(!h.operator().closed, "close is not called after a failure");
}

#[test]
fn processing_time_timers_fire_in_order_and_stop_at_finish() {
    let mut h = Harness::new(Counter::default(), Options { allow_clock: true, processing_time: 100, ..Options::default() });
    h.open().unwrap();
    h.process_element(&rec("b", "ptimer:150", 1), 0).unwrap();
    h.process_element(&rec("a", "ptimer:150", 1), 0).unwrap();
    h.process_element(&rec("a", "ptimer:120", 1), 0).unwrap();
    h.process_element(&rec("a", "ptimer:120", 1), 0).unwrap(); // same (key, ts): one timer
    h.process_element(&rec("c", "ptimer:500", 1), 0).unwrap();
    h.set_processing_time(119).unwrap();
    assert!(h.output().is_empty());
    h.set_processing_time(150).unwrap();
    let got: Vec<String> = outs(&h).into_iter().map(|o| format!("{} {}", o.0, o.1)).collect();
    assert_eq!(got, vec!["a ptimer 120 count=0", "a ptimer 150 count=0", "b ptimer 150 count=0"]);
    assert!(h.set_processing_time(10).is_err(), "processing time never goes back");
    h.end_input(0).unwrap();
    h.finish().unwrap();
    h.set_processing_time(1000).unwrap();
    assert_eq!(h.output().len(), 3, "no processing-time timer fires after finish");
    assert_eq!(h.emitted_watermarks(), &[MAX_WATERMARK]);
    h.close().unwrap();
    assert!(h.operator().closed);
}

#[test]
fn keys_of_other_subtasks_are_refused() {
    let mut h = Harness::new(Counter::default(), Options { subtask: 0, parallelism: 3, ..Options::default() });
    h.open().unwrap();
    let e = h.process_element(&rec("hello", "x", 1), 0).unwrap_err();
    assert!(e.message().contains("belongs to subtask 2"), "{}", e);
}

/// Snapshots of 2 subtasks restore into 3: every key keeps its count and
/// timers, whichever subtask it lands on.
#[test]
fn snapshot_and_restore_at_another_parallelism() {
    let keys: Vec<String> = (0..40).map(|i| format!("k{}", i)).collect();
    let mut snaps: Vec<Snapshot> = Vec::new();
    for sub in 0..2 {
        let mut h = Harness::new(Counter::default(), Options { subtask: sub, parallelism: 2, ..Options::default() });
        h.open().unwrap();
        for k in keys.iter().filter(|k| subtask_for_key(k.as_bytes(), 128, 2) == sub) {
            h.process_element(&rec(k, "x", 1), 0).unwrap();
            h.process_element(&rec(k, "etimer:50", 1), 0).unwrap();
        }
        snaps.push(h.snapshot(7).unwrap());
    }
    assert_eq!(snaps.iter().map(Snapshot::timers).sum::<usize>(), 40);
    let mut fired = 0;
    for sub in 0..3 {
        let mut h = Harness::new(Counter::default(), Options { subtask: sub, parallelism: 3, restore: snaps.clone(), ..Options::default() });
        h.open().unwrap();
        let mine: Vec<&String> = keys.iter().filter(|k| subtask_for_key(k.as_bytes(), 128, 3) == sub).collect();
        for k in &mine {
            h.process_element(&rec(k, "y", 2), 0).unwrap();
        }
        assert!(outs(&h).iter().all(|o| o.1 == "2"), "counts continue after the restore");
        h.process_watermark(50).unwrap();
        let timers: Vec<_> = outs(&h).into_iter().filter(|o| o.1.starts_with("etimer")).collect();
        assert_eq!(timers.len(), mine.len());
        assert!(timers.iter().all(|o| o.1 == "etimer 50 count=2 seen=x,y map=x=1;y=1"), "{:?}", timers);
        fired += timers.len();
    }
    assert_eq!(fired, 40);
}

/// TTL: values expire ttl after the last write (and read, with OnReadAndWrite);
/// list elements one by one; snapshots drop expired entries.
struct Ttl {
    v: ValueState<Str>,
    r: ValueState<Str>,
    l: ListState<Str>,
}

impl Operator for Ttl {
    fn open(&mut self, _: &Context) -> Result<()> {
        self.v = ValueState::new("v").with_ttl(100, TtlUpdate::OnCreateAndWrite);
        self.r = ValueState::new("r").with_ttl(100, TtlUpdate::OnReadAndWrite);
        self.l = ListState::new("l").with_ttl(100, TtlUpdate::OnCreateAndWrite);
        Ok(())
    }
    fn process_element(&mut self, rec: &Record<'_>, _: u32) -> Result<()> {
        match rec.value {
            b"write" => {
                self.v.set(&"v".into());
                self.r.set(&"r".into());
                self.l.add(&format!("e{}", rec.timestamp));
            }
            b"read-r" => {
                self.r.get();
            }
            _ => {
                let show = format!("{:?} {:?} {:?}", self.v.get(), self.r.get(), self.l.get());
                emit(rec.key, show.as_bytes(), rec.timestamp);
            }
        }
        Ok(())
    }
}

#[test]
fn ttl_expires_values_and_list_elements() {
    let op = Ttl { v: ValueState::new("v"), r: ValueState::new("r"), l: ListState::new("l") };
    let mut h = Harness::new(op, Options::default());
    h.open().unwrap();
    h.process_element(&rec("k", "write", 1), 0).unwrap();
    h.set_processing_time(50).unwrap();
    h.process_element(&rec("k", "write", 2), 0).unwrap(); // v, r rewritten at 50; second element
    h.set_processing_time(120).unwrap();
    h.process_element(&rec("k", "read-r", 0), 0).unwrap(); // r refreshed to 220
    h.process_element(&rec("k", "show", 0), 0).unwrap();
    h.set_processing_time(150).unwrap();
    h.process_element(&rec("k", "show", 0), 0).unwrap();
    h.set_processing_time(221).unwrap();
    assert_eq!(h.snapshot(1).unwrap().keyed_entries(), 1, "expired entries leave the snapshot");
    h.process_element(&rec("k", "show", 0), 0).unwrap();
    let got: Vec<String> = outs(&h).into_iter().map(|o| o.1).collect();
    assert_eq!(
        got,
        vec![
            r#"Some("v") Some("r") ["e2"]"#, // the element of t=0 expired at 100
            r#"None Some("r") []"#,          // r was read at 120 and 150: lives to 250
            r#"None Some("r") []"#,
        ]
    );
    assert_eq!(h.keyed_state_len(), 1);
}

#[test]
fn with_ttl_outside_open_fails() {
    struct Late;
    impl Operator for Late {
        fn process_element(&mut self, _: &Record<'_>, _: u32) -> Result<()> {
            let _ = ValueState::<I64>::new("x").with_ttl(10, TtlUpdate::OnCreateAndWrite);
            Ok(())
        }
    }
    let mut h = Harness::new(Late, Options::default());
    h.open().unwrap();
    let e = h.process_element(&rec("k", "v", 1), 0).unwrap_err();
    assert!(e.message().contains("with_ttl must be called in open"), "{}", e);
}

/// Namespaces separate values; map state clear, contains, is_empty.
#[test]
fn namespaces_and_map_state() {
    struct Ns;
    impl Operator for Ns {
        fn process_element(&mut self, rec: &Record<'_>, _: u32) -> Result<()> {
            let a = ValueState::<I64>::new("c").in_namespace(b"a");
            let b = ValueState::<I64>::new("c").in_namespace(b"b");
            a.set(&1);
            b.set(&(b.get().unwrap_or(0) + 10));
            let m = MapState::<I64, Str>::new("m").in_namespace(rec.value);
            assert!(m.is_empty());
            m.put(&3, &"three".into());
            m.put(&-1, &"minus".into());
            m.put(&2, &"two".into());
            assert!(m.contains(&2) && !m.contains(&5));
            m.remove(&2);
            let e: Vec<String> = m.entries().into_iter().map(|(k, v)| format!("{}:{}", k, v)).collect();
            emit(rec.key, format!("{} {} {}", a.get().unwrap(), b.get().unwrap(), e.join(",")).as_bytes(), 0);
            m.clear();
            assert!(m.is_empty());
            let plain = ValueState::<I64>::new("c");
            assert_eq!(plain.get(), None, "no namespace is another entry");
            Ok(())
        }
    }
    let mut h = Harness::new(Ns, Options::default());
    h.open().unwrap();
    h.process_element(&rec("k", "w1", 1), 0).unwrap();
    h.process_element(&rec("k", "w2", 1), 0).unwrap();
    // Map entries come back sorted by encoded user key (little-endian i64 bytes).
    let got: Vec<String> = outs(&h).into_iter().map(|o| o.1).collect();
    assert_eq!(got, vec!["1 10 3:three,-1:minus", "1 20 3:three,-1:minus"]);
}

#[test]
fn reducing_and_aggregating_state() {
    struct Avg;
    impl Aggregator for Avg {
        type In = f64;
        type Acc = Vec<u8>;
        type Out = f64;
        fn create_accumulator(&self) -> Vec<u8> {
            [0f64.to_le_bytes(), 0f64.to_le_bytes()].concat()
        }
        fn add(&self, v: f64, acc: Vec<u8>) -> Vec<u8> {
            let (s, n) = split(&acc);
            [(s + v).to_le_bytes(), (n + 1.0).to_le_bytes()].concat()
        }
        fn get_result(&self, acc: &Vec<u8>) -> f64 {
            let (s, n) = split(acc);
            s / n
        }
        fn merge(&self, a: Vec<u8>, b: Vec<u8>) -> Vec<u8> {
            let ((s1, n1), (s2, n2)) = (split(&a), split(&b));
            [(s1 + s2).to_le_bytes(), (n1 + n2).to_le_bytes()].concat()
        }
    }
    fn split(b: &[u8]) -> (f64, f64) {
        (F64::decode(&b[..8]).unwrap(), F64::decode(&b[8..]).unwrap())
    }
    struct Op;
    impl Operator for Op {
        fn process_element(&mut self, rec: &Record<'_>, _: u32) -> Result<()> {
            let v: f64 = std::str::from_utf8(rec.value)?.parse().map_err(|_| Error::new("not a number"))?;
            let max = ReducingState::<F64, _>::new("max", f64::max);
            max.add(v);
            let avg = AggregatingState::<Bytes, _>::new("avg", Avg);
            avg.add(v);
            emit(rec.key, format!("{} {}", max.get().unwrap(), avg.get().unwrap()).as_bytes(), 0);
            Ok(())
        }
    }
    let mut h = Harness::new(Op, Options::default());
    h.open().unwrap();
    for v in ["1", "5", "3"] {
        h.process_element(&rec("k", v, 0), 0).unwrap();
    }
    let got: Vec<String> = outs(&h).into_iter().map(|o| o.1).collect();
    assert_eq!(got, vec!["1 1", "5 3", "5 3"]);
}

/// emit_watermark makes the output watermark the operator's own; emit_to
/// fills side outputs; input_watermark tells each input's watermark.
#[test]
fn own_watermarks_side_outputs_and_input_watermarks() {
    struct Op;
    impl Operator for Op {
        fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
            if rec.value == b"side" {
                emit_to("odd-ones", rec.key, rec.value, rec.timestamp);
            } else {
                emit(rec.key, rec.value, rec.timestamp);
            }
            let w = format!("{} {}", input_watermark(0), input_watermark(1));
            emit(b"", w.as_bytes(), 0);
            Ok(())
        }
        fn on_watermark(&mut self, ts: i64) -> Result<()> {
            if ts >= 20 {
                emit_watermark(ts - 5);
                emit_watermark(ts - 10); // not above the last one: ignored
            }
            Ok(())
        }
        fn finish(&mut self) -> Result<()> {
            input_watermark(2);
            Ok(())
        }
    }
    let mut h = Harness::new(Op, Options { num_inputs: 2, ..Options::default() });
    h.open().unwrap();
    h.process_watermark_of(0, 10).unwrap();
    assert!(h.emitted_watermarks().is_empty(), "input 1 holds the watermark back");
    h.process_watermark_of(1, 12).unwrap();
    h.process_element(&rec("k", "side", 3), 1).unwrap();
    h.process_element(&rec("k", "main", 4), 0).unwrap();
    h.process_watermark(30).unwrap();
    h.process_watermark(40).unwrap();
    assert_eq!(h.emitted_watermarks(), &[10, 25, 35]);
    assert_eq!(h.side_output("odd-ones").len(), 1);
    assert_eq!(h.side_output("odd-ones")[0].key, b"k");
    let got: Vec<String> = outs(&h).into_iter().map(|o| o.1).collect();
    assert_eq!(got, vec!["10 12", "main", "10 12"]);
    let e = h.finish().unwrap_err();
    assert!(e.message().contains("input_watermark: input 2 out of range"), "{}", e);
}

#[test]
fn processing_time_needs_allow_clock() {
    struct Op;
    impl Operator for Op {
        fn process_element(&mut self, rec: &Record<'_>, _: u32) -> Result<()> {
            emit(rec.key, current_processing_time().to_string().as_bytes(), 0);
            Ok(())
        }
    }
    let mut h = Harness::new(Op, Options { processing_time: 77, ..Options::default() });
    h.open().unwrap();
    let e = h.process_element(&rec("k", "v", 0), 0).unwrap_err();
    assert_eq!(e.message(), "processing_time needs allow_clock: true (job file)");
    let mut h = Harness::new(Op, Options { processing_time: 77, allow_clock: true, ..Options::default() });
    h.open().unwrap();
    h.process_element(&rec("k", "v", 0), 0).unwrap();
    assert_eq!(h.output()[0].value, b"77");
}

#[test]
fn operator_list_state_restores_by_mode() {
    struct Op(u64);
    impl Operator for Op {
        fn open(&mut self, _: &Context) -> Result<()> {
            self.0 = list_state::entries("split").len() as u64 * 100 + list_state::entries("union").len() as u64;
            Ok(())
        }
        fn process_element(&mut self, _: &Record<'_>, _: u32) -> Result<()> {
            Ok(())
        }
        fn snapshot_state(&mut self, id: i64) -> Result<()> {
            for i in 0..3 {
                list_state::add("split", ListMode::Split, &[i]);
            }
            list_state::add("union", ListMode::Union, &id.to_le_bytes());
            Ok(())
        }
    }
    let snaps: Vec<Snapshot> = (0..2)
        .map(|sub| {
            let mut h = Harness::new(Op(0), Options { subtask: sub, parallelism: 2, ..Options::default() });
            h.open().unwrap();
            h.snapshot(3).unwrap()
        })
        .collect();
    let got: Vec<u64> = (0..4)
        .map(|sub| {
            let mut h = Harness::new(Op(0), Options { subtask: sub, parallelism: 4, restore: snaps.clone(), ..Options::default() });
            h.open().unwrap();
            h.operator().0
        })
        .collect();
    // 6 split entries over 4 subtasks round robin; 2 union entries each.
    assert_eq!(got, vec![202, 202, 102, 102]);
}

#[test]
fn emitting_in_open_fails() {
    struct Op;
    impl Operator for Op {
        fn open(&mut self, _: &Context) -> Result<()> {
            emit(b"", b"x", 0);
            Ok(())
        }
        fn process_element(&mut self, _: &Record<'_>, _: u32) -> Result<()> {
            Ok(())
        }
    }
    let mut h = Harness::new(Op, Options::default());
    let e = h.open().unwrap_err();
    assert!(e.message().contains("emit is not allowed in open"), "{}", e);
}

#[test]
fn typed_helpers() {
    let mut m = Harness::new(map_typed::<Str, I64, _>(|s: String| Ok(s.len() as i64)), Options::default());
    m.open().unwrap();
    m.process_element(&rec("k", "four", 9), 0).unwrap();
    assert_eq!(m.output()[0].value, 4i64.to_le_bytes());
    assert_eq!((m.output()[0].key.as_slice(), m.output()[0].timestamp), (&b"k"[..], 9));
    // A value that does not decode is rejected (the job file's on_error decides), not a failure.
    let e = m.process_element(&Record::new(b"k", &[0xff], 1), 0).unwrap_err();
    assert!(e.is_rejection() && e.message().contains("map_typed: cannot decode the record value: not UTF-8"), "{}", e);
    assert!(m.failure().is_none());
    assert_eq!(m.rejections().len(), 1);

    let mut f = Harness::new(filter_typed::<I64, _>(|v: &i64| *v > 2), Options::default());
    f.open().unwrap();
    for v in [1i64, 3, 7] {
        f.process_element(&Record::new(b"", &v.to_le_bytes(), 0), 0).unwrap();
    }
    assert_eq!(f.output().len(), 2);

    let mut fm = Harness::new(
        flat_map_typed::<Str, Str, _>(|s: String, out: &mut typed::TypedCollector<'_, Str>| {
            for w in s.split_whitespace() {
                out.emit_keyed(w.as_bytes(), &w.to_uppercase());
            }
            Ok(())
        }),
        Options::default(),
    );
    fm.open().unwrap();
    fm.process_element(&rec("", "a bc", 5), 0).unwrap();
    assert_eq!(outs(&fm), vec![("a".into(), "A".into(), 5), ("bc".into(), "BC".into(), 5)]);

    let mut p = Harness::new(
        process_typed::<Str, _>(|s: String, r: &Record<'_>| {
            let c = ValueState::<Str>::new("last");
            let prev = c.get().unwrap_or_default();
            c.set(&s);
            emit(r.key, format!("{}->{}", prev, s).as_bytes(), r.timestamp);
            Ok(())
        }),
        Options::default(),
    );
    p.open().unwrap();
    p.process_element(&rec("k", "a", 1), 0).unwrap();
    p.process_element(&rec("k", "b", 2), 0).unwrap();
    assert_eq!(outs(&p).into_iter().map(|o| o.1).collect::<Vec<_>>(), vec!["->a", "a->b"]);
}

#[test]
fn view_helpers() {
    use core::fmt::Write;
    // map_view: the value borrowed as &str, the result written into the frame.
    let mut m = Harness::new(
        map_view::<Str, Str, _>(|s: &str, out: &mut StrWriter| {
            out.push_str(s).make_ascii_uppercase();
            out.push('!');
            write!(out, "{}", s.len())?;
            out.push_ascii_uppercase(s);
            out.push_ascii_lowercase("ÀB");
            unsafe { out.as_mut_vec() }.push(b'.');
            Ok(())
        }),
        Options::default(),
    );
    m.open().unwrap();
    m.process_element(&rec("k", "héllo", 9), 0).unwrap();
    m.process_element(&rec("", "", 3), 0).unwrap();
    assert_eq!(outs(&m), vec![("k".into(), "HéLLO!6HéLLOÀb.".into(), 9), ("".into(), "!0Àb.".into(), 3)]);
    let e = m.process_element(&Record::new(b"k", &[b'a', 0xff], 1), 0).unwrap_err();
    assert!(e.is_rejection() && e.message().contains("map_view: cannot decode the record value: not UTF-8: invalid byte at 1"), "{}", e);
    assert!(m.failure().is_none());
    assert_eq!(m.output().len(), 2, "a value that does not decode emits nothing");

    // An error of the function is returned as it is (a failure, not a rejection).
    let mut bad = Harness::new(map_view::<I64, I64, _>(|_: &i64, _: &mut Encoder<I64>| Err(Error::new("no"))), Options::default());
    bad.open().unwrap();
    let e = bad.process_element(&Record::new(b"", &1i64.to_le_bytes(), 0), 0).unwrap_err();
    assert!(!e.is_rejection() && e.message() == "no", "{:?}", e);

    let mut n = Harness::new(map_view::<I64, F64, _>(|v: &i64, out: &mut Encoder<F64>| {
        out.write(&(*v as f64 / 2.0));
        Ok(())
    }), Options::default());
    n.open().unwrap();
    n.process_element(&Record::new(b"", &5i64.to_le_bytes(), 0), 0).unwrap();
    assert_eq!(n.output()[0].value, 2.5f64.to_bits().to_le_bytes());
    let e = n.process_element(&Record::new(b"", b"abc", 0), 0).unwrap_err();
    assert!(e.is_rejection() && e.message().contains("3 bytes, want 8"), "{}", e);

    let mut b = Harness::new(map_view::<Bytes, Bytes, _>(|v: &[u8], out: &mut BytesWriter| {
        out.append(v).reverse();
        out.extend(b"..");
        Ok(())
    }), Options::default());
    b.open().unwrap();
    b.process_element(&Record::new(b"", &[1, 2, 0xff], 0), 0).unwrap();
    assert_eq!(b.output()[0].value, vec![0xff, 2, 1, b'.', b'.']);

    // A codec of one's own: the decoded value as its view, Encoder as its writer.
    struct Point;
    impl Codec for Point {
        type Item = (i64, i64);
        fn encode(v: &(i64, i64), out: &mut Vec<u8>) {
            out.extend_from_slice(format!("{},{}", v.0, v.1).as_bytes())
        }
        fn decode(b: &[u8]) -> Result<(i64, i64)> {
            let s = core::str::from_utf8(b)?;
            let (x, y) = s.split_once(',').ok_or("no comma")?;
            Ok((x.parse()?, y.parse()?))
        }
    }
    impl ViewCodec for Point {
        type View = (i64, i64);
        fn with_view<R>(b: &[u8], f: impl FnOnce(&(i64, i64)) -> R) -> Result<R> {
            Ok(f(&Self::decode(b)?))
        }
    }
    impl WriteCodec for Point {
        type Writer = Encoder<Self>;
        fn writer(out: &mut Vec<u8>) -> &mut Encoder<Self> {
            Encoder::over(out)
        }
    }
    let mut pt = Harness::new(map_view::<Point, Point, _>(|p: &(i64, i64), out: &mut Encoder<Point>| {
        out.write(&(p.1, p.0));
        Ok(())
    }), Options::default());
    pt.open().unwrap();
    pt.process_element(&rec("k", "1,-2", 0), 0).unwrap();
    assert_eq!(outs(&pt), vec![("k".into(), "-2,1".into(), 0)]);
    let e = pt.process_element(&rec("k", "12", 0), 0).unwrap_err();
    assert!(e.is_rejection() && e.message() == "map_view: cannot decode the record value: no comma", "{}", e);

    // filter_view: unchanged records, nothing copied.
    let mut f = Harness::new(filter_view::<Str, _>(|s: &str| s.starts_with('a')), Options::default());
    f.open().unwrap();
    for v in ["ab", "ba", "a"] {
        f.process_element(&rec("k", v, 1), 0).unwrap();
    }
    assert_eq!(outs(&f), vec![("k".into(), "ab".into(), 1), ("k".into(), "a".into(), 1)]);
    let e = f.process_element(&Record::new(b"k", &[0xc3], 1), 0).unwrap_err();
    assert!(e.is_rejection() && e.message().contains("filter_view: cannot decode"), "{}", e);

    // flat_map_view: any number of values, each written into the frame.
    let mut fm = Harness::new(
        flat_map_view::<Str, Str, _>(|s: &str, out: &mut typed::ViewCollector<'_, Str>| {
            for w in s.split_whitespace() {
                out.emit_keyed(w.as_bytes(), |o| {
                    o.push_str(w).make_ascii_uppercase();
                });
            }
            out.emit(|o| o.extend("end".chars()));
            Ok(())
        }),
        Options::default(),
    );
    fm.open().unwrap();
    fm.process_element(&rec("x", "a bc", 5), 0).unwrap();
    assert_eq!(outs(&fm), vec![("a".into(), "A".into(), 5), ("bc".into(), "BC".into(), 5), ("x".into(), "end".into(), 5)]);

    // process_view: keyed state of the record's key.
    let mut p = Harness::new(
        process_view::<Str, _>(|s: &str, r: &Record<'_>| {
            let c = ValueState::<Str>::new("last");
            let prev = c.get().unwrap_or_default();
            c.set(&s.to_string());
            emit(r.key, format!("{}->{}", prev, s).as_bytes(), r.timestamp);
            Ok(())
        }),
        Options::default(),
    );
    p.open().unwrap();
    p.process_element(&rec("k", "a", 1), 0).unwrap();
    p.process_element(&rec("k", "b", 2), 0).unwrap();
    p.process_element(&rec("j", "c", 2), 0).unwrap();
    assert_eq!(outs(&p).into_iter().map(|o| o.1).collect::<Vec<_>>(), vec!["->a", "a->b", "->c"]);
}

#[test]
fn a_panic_becomes_the_failure_message() {
    struct Op;
    impl Operator for Op {
        fn process_element(&mut self, _: &Record<'_>, _: u32) -> Result<()> {
            panic!("boom {}", 42)
        }
    }
    let mut h = Harness::new(Op, Options::default());
    h.open().unwrap();
    let e = h.process_element(&rec("k", "v", 0), 0).unwrap_err();
    assert_eq!(e.message(), "panicked: boom 42");
}

#[test]
fn a_rejection_undoes_the_batch_state_and_timers() {
    struct Op;
    impl Operator for Op {
        fn process_element(&mut self, rec: &Record<'_>, _: u32) -> Result<()> {
            COUNT.set(&(COUNT.get().unwrap_or(0) + 1));
            SEEN.add(&"x".to_string());
            BY_VALUE.clear();
            timer::register_event_time(5);
            timer::delete_processing_time(7);
            emit(rec.key, b"out", 0);
            if rec.value == b"bad" {
                return Err(reject("bad record"));
            }
            BY_VALUE.put(&"v".to_string(), &1);
            Ok(())
        }
    }
    let mut h = Harness::new(Op, Options::default());
    h.open().unwrap();
    h.process_element(&rec("k", "ok", 1), 0).unwrap();
    h.process_element(&rec("k", "ptimer", 1), 0).unwrap();
    let before = (h.keyed_state_len(), h.event_timers(), h.output().len());
    let e = h.process_element(&rec("k", "bad", 3), 0).unwrap_err();
    assert!(e.is_rejection());
    assert_eq!((h.keyed_state_len(), h.event_timers(), h.output().len()), before, "nothing of the rejected call stays");
    let e = h.process_batch(&[rec("k", "ok", 2), rec("k", "bad", 3)], 0).unwrap_err();
    assert!(e.is_rejection());
    assert_eq!(h.output().len(), before.2 + 1, "only the good record's output stays");
    assert_eq!(h.rejections(), &["bad record".to_string(), "bad record".to_string()]);
    h.process_element(&rec("k", "ok", 4), 0).unwrap();
    assert_eq!(h.output().last().unwrap().value, b"out");
    struct Show;
    impl Operator for Show {
        fn process_element(&mut self, rec: &Record<'_>, _: u32) -> Result<()> {
            emit(rec.key, format!("{:?} {}", COUNT.get(), SEEN.get().len()).as_bytes(), 0);
            Ok(())
        }
    }
    let snap = h.snapshot(1).unwrap();
    let mut s = Harness::new(Show, Options { restore: vec![snap], ..Options::default() });
    s.open().unwrap();
    s.process_element(&rec("k", "", 0), 0).unwrap();
    assert_eq!(s.output()[0].value, b"Some(4) 4", "the batch's good record is replayed alone");
}

#[test]
fn typed_helpers_keep_headers() {
    let mut block = Vec::new();
    append_header(&mut block, b"trace", b"t-1");
    let hd = Headers::new(&block).unwrap();
    let run = |op: Box<dyn Operator>, value: &[u8], per: usize| {
        let mut h = Harness::new(op, Options::default());
        h.open().unwrap();
        h.process_element(&Record::new(b"k", value, 1).with_headers(hd), 0).unwrap();
        h.process_element(&Record::new(b"k", value, 2), 0).unwrap();
        let out = h.output().to_vec();
        assert_eq!(out.len(), 2 * per);
        for (i, o) in out.iter().enumerate() {
            let want: &[u8] = if i < per { &block } else { &[] };
            assert_eq!(o.headers.as_slice(), want, "output {} of {:?}", i, out);
        }
    };
    let seven = 7i64.to_le_bytes();
    run(Box::new(map_typed::<I64, I64, _>(|v: i64| Ok(v + 1))), &seven, 1);
    run(Box::new(filter_typed::<I64, _>(|_: &i64| true)), &seven, 1);
    run(Box::new(map_view::<Str, Str, _>(|s: &str, out: &mut StrWriter| {
        out.push_str(s);
        Ok(())
    })), b"a", 1);
    run(Box::new(filter_view::<Str, _>(|_: &str| true)), b"a", 1);
    run(Box::new(flat_map_typed::<Str, Str, _>(|s: String, out: &mut typed::TypedCollector<'_, Str>| {
        out.emit(&s);
        out.emit_keyed(b"other", &s);
        Ok(())
    })), b"a", 2);
    run(Box::new(flat_map_view::<Str, Str, _>(|s: &str, out: &mut typed::ViewCollector<'_, Str>| {
        out.emit(|w| {
            w.push_str(s);
        });
        Ok(())
    })), b"a", 1);
}
