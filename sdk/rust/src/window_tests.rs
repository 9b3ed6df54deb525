//! Window tests through the native harness: assigners, functions, lateness,
//! sessions, processing time, cleanup, rescaled restore, and a randomized
//! comparison with a brute-force reference.

use crate::testing::{subtask_for_key, Harness, Options, Snapshot};
use crate::window::TimeDomain;
use crate::*;
use std::collections::BTreeMap;

struct Count;
impl Aggregator for Count {
    type In = Vec<u8>;
    type Acc = i64;
    type Out = i64;
    fn create_accumulator(&self) -> i64 {
        0
    }
    fn add(&self, _: Vec<u8>, acc: i64) -> i64 {
        acc + 1
    }
    fn get_result(&self, acc: &i64) -> i64 {
        *acc
    }
    fn merge(&self, a: i64, b: i64) -> i64 {
        a + b
    }
}

fn counting(assigner: WindowAssigner, lateness: i64, late: Option<&str>) -> WindowOperator<window::AggregateFn<Bytes, I64, I64, Count>> {
    let mut w = Windows::<Bytes>::new(assigner).allowed_lateness(lateness);
    if let Some(name) = late {
        w = w.late_output(name);
    }
    w.aggregate::<I64, I64, _>(Count)
}

fn rec<'a>(k: &'a str, v: &'a [u8], ts: i64) -> Record<'a> {
    Record::new(k.as_bytes(), v, ts)
}

/// (key, timestamp, count) of each output record.
fn counts(h: &Harness<impl Operator>) -> Vec<(String, i64, i64)> {
    h.output().iter().map(|r| (String::from_utf8_lossy(&r.key).into_owned(), r.timestamp, I64::decode(&r.value).unwrap())).collect()
}

fn texts(h: &Harness<impl Operator>) -> Vec<String> {
    h.output().iter().map(|r| format!("{}@{} {}", String::from_utf8_lossy(&r.key), r.timestamp, String::from_utf8_lossy(&r.value))).collect()
}

#[test]
fn assigners() {
    let t = WindowAssigner::tumbling_event_time(10, 0);
    assert_eq!(t.assign(0), vec![TimeWindow::new(0, 10)]);
    assert_eq!(t.assign(9), vec![TimeWindow::new(0, 10)]);
    assert_eq!(t.assign(-1), vec![TimeWindow::new(-10, 0)]);
    assert_eq!(WindowAssigner::tumbling_event_time(10, 3).assign(2), vec![TimeWindow::new(-7, 3)]);
    let s = WindowAssigner::sliding_event_time(10, 5);
    assert_eq!(s.assign(7), vec![TimeWindow::new(5, 15), TimeWindow::new(0, 10)]);
    assert_eq!(s.assign(-3), vec![TimeWindow::new(-5, 5), TimeWindow::new(-10, 0)]);
    assert_eq!(WindowAssigner::sliding_event_time(10, 3).assign(0).len(), 4);
    assert_eq!(WindowAssigner::event_time_session(4).assign(7), vec![TimeWindow::new(7, 11)]);
    assert_eq!(WindowAssigner::sliding_processing_time(10, 5).domain(), TimeDomain::ProcessingTime);
    assert_eq!(TimeWindow::new(0, 10).max_timestamp(), 9);
    for w in [TimeWindow::new(-5, 3), TimeWindow::new(i64::MIN, i64::MAX), TimeWindow::new(7, 8)] {
        assert_eq!(TimeWindow::from_namespace(&w.namespace()), Some(w));
    }
    // Namespaces sort like windows, negative starts included.
    assert!(TimeWindow::new(-5, 0).namespace() < TimeWindow::new(3, 4).namespace());
    let bad = std::panic::catch_unwind(|| WindowAssigner::sliding_event_time(10, 0));
    assert!(bad.is_err());
}

#[test]
fn tumbling_event_time_fires_on_the_watermark_and_cleans_up() {
    let mut h = Harness::new(counting(WindowAssigner::tumbling_event_time(10, 0), 0, None), Options::default());
    h.open().unwrap();
    for r in [rec("a", b"x", 1), rec("b", b"x", 5), rec("a", b"x", 3), rec("a", b"x", 12)] {
        h.process_element(&r, 0).unwrap();
    }
    h.process_watermark(8).unwrap();
    assert!(h.output().is_empty());
    h.process_watermark(9).unwrap();
    assert_eq!(counts(&h), vec![("a".into(), 9, 2), ("b".into(), 9, 1)]);
    h.process_watermark(30).unwrap();
    assert_eq!(counts(&h)[2], ("a".into(), 19, 1));
    assert_eq!(h.keyed_state_len(), 0, "every window's state is cleared once it fired");
    assert!(h.event_timers().is_empty());
    // A record for a window that already fired (no lateness) is dropped and counted.
    h.process_element(&rec("a", b"x", 15), 0).unwrap();
    assert_eq!(h.operator().late_dropped(), 1);
    assert_eq!(h.keyed_state_len(), 0);
}

#[test]
fn sliding_reduce() {
    let op = Windows::<I64>::new(WindowAssigner::sliding_event_time(10, 5)).reduce(|a, b| a + b);
    let mut h = Harness::new(op, Options::default());
    h.open().unwrap();
    h.process_element(&rec("k", &7i64.to_le_bytes(), 7), 0).unwrap();
    h.process_element(&rec("k", &100i64.to_le_bytes(), 12), 0).unwrap();
    h.process_watermark(MAX_WATERMARK).unwrap();
    assert_eq!(counts(&h), vec![("k".into(), 9, 7), ("k".into(), 14, 107), ("k".into(), 19, 100)]);
    assert_eq!(h.keyed_state_len(), 0);
}

#[test]
fn process_and_aggregate_process_windows() {
    let op = Windows::<Str>::new(WindowAssigner::tumbling_event_time(10, 0)).process(|key: &[u8], w: TimeWindow, elems: &[String], out: &mut WindowOutput<'_>| {
        assert_eq!(out.key(), key);
        out.emit(format!("[{},{}) {}", w.start, w.end, elems.join(",")).as_bytes());
        Ok(())
    });
    let mut h = Harness::new(op, Options::default());
    h.open().unwrap();
    for (v, ts) in [("b", 2), ("a", 1), ("c", 11)] {
        h.process_element(&rec("k", v.as_bytes(), ts), 0).unwrap();
    }
    h.process_watermark(100).unwrap();
    assert_eq!(texts(&h), vec!["k@9 [0,10) b,a", "k@19 [10,20) c"]);

    let op = Windows::<Bytes>::new(WindowAssigner::tumbling_event_time(10, 0)).aggregate_process::<I64, _, _>(
        Count,
        |key: &[u8], w: TimeWindow, n: i64, out: &mut WindowOutput<'_>| {
            out.emit_keyed(b"all", format!("{} {} {}", String::from_utf8_lossy(key), w.end, n).as_bytes());
            Ok(())
        },
    );
    let mut h = Harness::new(op, Options::default());
    h.open().unwrap();
    for ts in [1, 2, 3] {
        h.process_element(&rec("k", b"", ts), 0).unwrap();
    }
    h.process_watermark(100).unwrap();
    assert_eq!(texts(&h), vec!["all@9 k 10 3"]);
}

#[test]
fn allowed_lateness_refires_and_late_records_go_to_the_side_output() {
    let mut h = Harness::new(counting(WindowAssigner::tumbling_event_time(10, 0), 5, Some("late")), Options::default());
    h.open().unwrap();
    h.process_element(&rec("k", b"1", 1), 0).unwrap();
    h.process_watermark(9).unwrap();
    assert_eq!(counts(&h), vec![("k".into(), 9, 1)]);
    // Late but within the lateness: the window fires again at once with the new count.
    h.process_element(&rec("k", b"2", 3), 0).unwrap();
    assert_eq!(counts(&h)[1], ("k".into(), 9, 2));
    assert_eq!(h.keyed_state_len(), 1, "state is kept until max timestamp + lateness");
    h.process_watermark(13).unwrap();
    h.process_element(&rec("k", b"3", 4), 0).unwrap();
    assert_eq!(counts(&h)[2], ("k".into(), 9, 3));
    h.process_watermark(14).unwrap();
    assert_eq!(h.keyed_state_len(), 0, "cleared at max timestamp + lateness");
    assert_eq!(counts(&h).len(), 3, "the cleanup does not fire");
    // Now it is too late: the original record goes to the side output.
    h.process_element(&rec("k", b"4", 5), 0).unwrap();
    assert_eq!(counts(&h).len(), 3);
    let late = h.side_output("late");
    assert_eq!(late.len(), 1);
    assert_eq!((late[0].key.as_slice(), late[0].value.as_slice(), late[0].timestamp), (&b"k"[..], &b"4"[..], 5));
    assert_eq!(h.operator().late_dropped(), 0);
    assert_eq!(h.keyed_state_len(), 0);
    assert!(h.event_timers().is_empty());
}

#[test]
fn a_record_late_for_some_sliding_windows_only_goes_to_the_others() {
    let mut h = Harness::new(counting(WindowAssigner::sliding_event_time(10, 5), 0, Some("late")), Options::default());
    h.open().unwrap();
    h.process_watermark(9).unwrap();
    // ts 7: [0,10) is late (9 <= 9), [5,15) is not.
    h.process_element(&rec("k", b"", 7), 0).unwrap();
    h.process_watermark(100).unwrap();
    assert_eq!(counts(&h), vec![("k".into(), 14, 1)]);
    assert!(h.side_output("late").is_empty());
}

fn session_op() -> WindowOperator<window::ProcessFn<Str, fn(&[u8], TimeWindow, &[String], &mut WindowOutput<'_>) -> Result<()>>> {
    fn f(_: &[u8], w: TimeWindow, elems: &[String], out: &mut WindowOutput<'_>) -> Result<()> {
        let mut e = elems.to_vec();
        e.sort();
        out.emit(format!("[{},{}) {}", w.start, w.end, e.join(",")).as_bytes());
        Ok(())
    }
    Windows::<Str>::new(WindowAssigner::event_time_session(10)).allowed_lateness(5).process(f as fn(&[u8], TimeWindow, &[String], &mut WindowOutput<'_>) -> Result<()>)
}

#[test]
fn session_windows_merge() {
    let mut h = Harness::new(session_op(), Options::default());
    h.open().unwrap();
    let at = |h: &mut Harness<_>, k: &str, ts: i64| h.process_element(&rec(k, ts.to_string().as_bytes(), ts), 0).unwrap();
    at(&mut h, "a", 0);
    at(&mut h, "a", 5); // [0,15)
    at(&mut h, "a", 30); // [30,40)
    at(&mut h, "b", 3); // another key: [3,13)
    at(&mut h, "a", 20); // [20,30) touches [30,40): [20,40)
    let ts: Vec<i64> = h.event_timers().into_iter().filter(|t| t.1 == b"a").map(|t| t.0).collect();
    assert_eq!(ts, vec![14, 19, 39, 44], "timers of merged-away windows are deleted");
    at(&mut h, "a", 14); // [14,24) bridges [0,15) and [20,40): [0,40)
    let ts: Vec<i64> = h.event_timers().into_iter().filter(|t| t.1 == b"a").map(|t| t.0).collect();
    assert_eq!(ts, vec![39, 44]);
    h.process_watermark(39).unwrap();
    assert_eq!(texts(&h), vec!["b@12 [3,13) 3", "a@39 [0,40) 0,14,20,30,5"]);
    // Within the lateness a record extends the fired session and fires it again.
    at(&mut h, "a", 35); // [35,45) merges into [0,45), max 44 > watermark 39: fires at 44
    h.process_watermark(44).unwrap();
    assert_eq!(texts(&h)[2], "a@44 [0,45) 0,14,20,30,35,5");
    h.process_watermark(49).unwrap();
    assert_eq!(h.keyed_state_len(), 0, "contents and session sets are cleared");
    assert!(h.event_timers().is_empty());
    at(&mut h, "a", 38); // [38,48) is past 47+5 <= 49? cleanup 52 > 49: a new session
    h.process_watermark(100).unwrap();
    assert_eq!(texts(&h)[3], "a@47 [38,48) 38");
    at(&mut h, "a", 1); // far too late: dropped and counted
    assert_eq!(h.operator().late_dropped(), 1);
}

#[test]
fn session_aggregates_merge_accumulators() {
    let op = Windows::<Bytes>::new(WindowAssigner::event_time_session(10)).aggregate::<I64, I64, _>(Count);
    let mut h = Harness::new(op, Options::default());
    h.open().unwrap();
    for ts in [0, 30, 15, 8, 22] {
        h.process_element(&rec("k", b"", ts), 0).unwrap();
    }
    h.process_watermark(100).unwrap();
    assert_eq!(counts(&h), vec![("k".into(), 39, 5)]);
    assert_eq!(h.keyed_state_len(), 0);
}

#[test]
fn processing_time_windows() {
    let op = counting(WindowAssigner::tumbling_processing_time(10, 0), 0, None);
    let mut h = Harness::new(op, Options { allow_clock: true, processing_time: 3, ..Options::default() });
    h.open().unwrap();
    h.process_element(&rec("k", b"", NO_TIMESTAMP), 0).unwrap();
    h.set_processing_time(8).unwrap();
    h.process_element(&rec("k", b"", NO_TIMESTAMP), 0).unwrap();
    h.process_watermark(1000).unwrap(); // event time does not matter
    assert!(h.output().is_empty());
    h.set_processing_time(9).unwrap();
    assert_eq!(counts(&h), vec![("k".into(), 9, 2)]);
    h.set_processing_time(12).unwrap();
    h.process_element(&rec("k", b"", NO_TIMESTAMP), 0).unwrap();
    h.set_processing_time(25).unwrap();
    assert_eq!(counts(&h)[1], ("k".into(), 19, 1));
    assert_eq!(h.keyed_state_len(), 0);

    let op = counting(WindowAssigner::processing_time_session(5), 0, None);
    let mut h = Harness::new(op, Options { allow_clock: true, ..Options::default() });
    h.open().unwrap();
    for t in [0, 3, 6] {
        h.set_processing_time(t).unwrap();
        h.process_element(&rec("k", b"", NO_TIMESTAMP), 0).unwrap();
    }
    h.set_processing_time(20).unwrap();
    assert_eq!(counts(&h), vec![("k".into(), 10, 3)]);

    // Without allow_clock a processing-time window fails the subtask with the host's message.
    let mut h = Harness::new(counting(WindowAssigner::tumbling_processing_time(10, 0), 0, None), Options::default());
    h.open().unwrap();
    let e = h.process_element(&rec("k", b"", 0), 0).unwrap_err();
    assert!(e.message().contains("allow_clock"), "{}", e);
}

#[test]
fn bad_records_are_rejected() {
    let mut h = Harness::new(Windows::<I64>::new(WindowAssigner::tumbling_event_time(10, 0)).reduce(|a, b| a + b), Options::default());
    h.open().unwrap();
    let e = h.process_element(&rec("k", &1i64.to_le_bytes(), NO_TIMESTAMP), 0).unwrap_err();
    assert!(e.is_rejection() && e.message().contains("without a timestamp"), "{}", e);
    let e = h.process_element(&rec("k", b"abc", 1), 0).unwrap_err();
    assert!(e.is_rejection() && e.message().contains("want 8"), "{}", e);
    assert!(h.failure().is_none());
}

/// Tiny deterministic generator for the randomized tests.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Out-of-order events with periodic watermarks, over keys.
fn events(seed: u64, n: usize) -> Vec<(String, i64, Option<i64>)> {
    let mut g = Lcg(seed);
    let mut max = 0i64;
    let mut out = Vec::new();
    for i in 0..n {
        let ts = (i as i64) * 3 + g.next(40) as i64 - 20;
        max = max.max(ts);
        let wm = if i % 7 == 6 { Some(max - g.next(25) as i64) } else { None };
        out.push((format!("k{}", g.next(5)), ts, wm));
    }
    out
}

/// The last count per (key, window max timestamp) as Flink's semantics give it:
/// a record counts in each window that is not late (max + lateness > watermark) on arrival.
fn reference(evs: &[(String, i64, Option<i64>)], a: &WindowAssigner, lateness: i64) -> (BTreeMap<(String, i64), i64>, usize) {
    let mut wm = i64::MIN;
    let mut m = BTreeMap::new();
    let mut late = 0;
    for (k, ts, w) in evs {
        let mut added = false;
        for win in a.assign(*ts) {
            if win.max_timestamp() + lateness > wm {
                *m.entry((k.clone(), win.max_timestamp())).or_insert(0) += 1;
                added = true;
            }
        }
        if !added {
            late += 1;
        }
        if let Some(w) = w {
            wm = wm.max(*w);
        }
    }
    (m, late)
}

fn last_counts(outs: &[(String, i64, i64)]) -> BTreeMap<(String, i64), i64> {
    let mut m = BTreeMap::new();
    for (k, ts, n) in outs {
        m.insert((k.clone(), *ts), *n);
    }
    m
}

#[test]
fn randomized_sliding_and_tumbling_windows_match_a_reference() {
    for seed in 1..=20u64 {
        for (a, lateness) in [
            (WindowAssigner::sliding_event_time(30, 10), 0),
            (WindowAssigner::sliding_event_time(30, 10), 15),
            (WindowAssigner::tumbling_event_time(20, 7), 0),
            (WindowAssigner::tumbling_event_time(20, 0), 40),
        ] {
            let evs = events(seed, 300);
            let mut h = Harness::new(counting(a, lateness, Some("late")), Options::default());
            h.open().unwrap();
            for (k, ts, wm) in &evs {
                h.process_element(&rec(k, b"", *ts), 0).unwrap();
                if let Some(w) = wm {
                    h.process_watermark(*w).unwrap();
                }
            }
            h.process_watermark(MAX_WATERMARK).unwrap();
            let (want, late) = reference(&evs, &a, lateness);
            assert_eq!(last_counts(&counts(&h)), want, "seed {} {:?} lateness {}", seed, a, lateness);
            assert_eq!(h.side_output("late").len(), late);
            assert_eq!(h.keyed_state_len(), 0);
            assert!(h.event_timers().is_empty());
            if lateness == 0 {
                assert_eq!(counts(&h).len(), want.len(), "without lateness every window fires once");
            }
        }
    }
}

/// Sessions against a reference that merges intervals per key offline (all
/// records on time: the watermark only comes at the end).
#[test]
fn randomized_sessions_match_a_reference() {
    for seed in 1..=30u64 {
        let mut g = Lcg(seed);
        let evs: Vec<(String, i64)> = (0..80).map(|_| (format!("k{}", g.next(3)), g.next(400) as i64)).collect();
        let gap = 12;
        let op = Windows::<Bytes>::new(WindowAssigner::event_time_session(gap)).aggregate::<I64, I64, _>(Count);
        let mut h = Harness::new(op, Options::default());
        h.open().unwrap();
        for (k, ts) in &evs {
            h.process_element(&rec(k, b"", *ts), 0).unwrap();
        }
        h.process_watermark(MAX_WATERMARK).unwrap();
        let mut want = BTreeMap::new();
        let mut by_key: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for (k, ts) in &evs {
            by_key.entry(k).or_default().push(*ts);
        }
        for (k, mut ts) in by_key {
            ts.sort();
            let (mut end, mut n) = (ts[0] + gap, 0);
            for t in ts {
                if t > end {
                    want.insert((k.to_string(), end - 1), n);
                    n = 0;
                }
                end = if n == 0 { t + gap } else { end.max(t + gap) };
                n += 1;
            }
            want.insert((k.to_string(), end - 1), n);
        }
        assert_eq!(last_counts(&counts(&h)), want, "seed {}", seed);
        assert_eq!(counts(&h).len(), want.len());
        assert_eq!(h.keyed_state_len(), 0);
    }
}

/// A checkpoint taken mid-stream on 2 subtasks, restored on 3: the result is
/// the same as one uninterrupted run.
#[test]
fn windows_survive_a_rescaled_restore() {
    let a = WindowAssigner::sliding_event_time(30, 10);
    let evs = events(42, 400);
    let run_part = |h: &mut Harness<_>, part: &[(String, i64, Option<i64>)], sub: u32, p: u32| {
        for (k, ts, wm) in part {
            if subtask_for_key(k.as_bytes(), 128, p) == sub {
                h.process_element(&rec(k, b"", *ts), 0).unwrap();
            }
            if let Some(w) = wm {
                h.process_watermark(*w).unwrap();
            }
        }
    };
    let mut one = Harness::new(counting(a, 10, None), Options::default());
    one.open().unwrap();
    run_part(&mut one, &evs, 0, 1);
    one.process_watermark(MAX_WATERMARK).unwrap();
    let mut want = counts(&one);
    want.sort();

    let (first, second) = evs.split_at(200);
    let mut got = Vec::new();
    let mut snaps: Vec<Snapshot> = Vec::new();
    for sub in 0..2 {
        let mut h = Harness::new(counting(a, 10, None), Options { subtask: sub, parallelism: 2, ..Options::default() });
        h.open().unwrap();
        run_part(&mut h, first, sub, 2);
        got.extend(counts(&h));
        snaps.push(h.snapshot(1).unwrap());
    }
    for sub in 0..3 {
        let mut h = Harness::new(counting(a, 10, None), Options { subtask: sub, parallelism: 3, restore: snaps.clone(), ..Options::default() });
        h.open().unwrap();
        // The restored subtask's watermark starts over; the next one brings it back.
        run_part(&mut h, second, sub, 3);
        h.process_watermark(MAX_WATERMARK).unwrap();
        got.extend(counts(&h));
    }
    got.sort();
    assert_eq!(got, want);
}
