//! The example through the SDK's native harness: input.jsonl -> key -> topn
//! as topn.yaml wires them, with the file source's watermarks (max ts seen
//! minus 2 s after each record, MAX at the end), compared with expected.txt.

use super::*;
use streamd::testing::{subtask_for_key, Harness, Options};
use streamd::MAX_WATERMARK;

fn opts(role: &str, subtask: u32, parallelism: u32) -> Options {
    Options { subtask, parallelism, config: vec![("role".into(), role.into())], ..Options::default() }
}

/// (line, ts) of input.jsonl: the file source with `timestamp: {field: ts}`.
fn input() -> Vec<(String, i64)> {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/input.jsonl"))
        .unwrap()
        .lines()
        .map(|l| (l.to_string(), json_field(l, "ts").unwrap().parse().unwrap()))
        .collect()
}

fn expected() -> Vec<String> {
    let s = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/expected.txt")).unwrap();
    s.lines().map(str::to_string).collect()
}

/// Runs the job with `p` topn subtasks; returns the sorted output values and the late records.
fn run(p: u32, late_extra: Option<(&str, i64)>) -> (Vec<String>, usize) {
    let mut key = Harness::new(Example::default(), opts("key", 0, 1));
    key.open().unwrap();
    let mut topn: Vec<Harness<Example>> = (0..p).map(|i| Harness::new(Example::default(), opts("topn", i, p))).collect();
    for h in &mut topn {
        h.open().unwrap();
    }
    let mut lines = input();
    if let Some((l, ts)) = late_extra {
        lines.push((l.to_string(), ts));
    }
    let mut max = i64::MIN;
    for (line, ts) in &lines {
        key.process_element(&Record::new(b"", line.as_bytes(), *ts), 0).unwrap();
        for r in key.output() {
            let i = subtask_for_key(&r.key, 128, p) as usize;
            topn[i].process_element(&Record::new(&r.key, &r.value, r.timestamp), 0).unwrap();
        }
        key.clear_output();
        max = max.max(*ts);
        for h in &mut topn {
            h.process_watermark(max - 2000).unwrap();
        }
    }
    let mut out = Vec::new();
    let mut late = 0;
    for h in &mut topn {
        h.process_watermark(MAX_WATERMARK).unwrap();
        h.end_input(0).unwrap();
        h.finish().unwrap();
        for r in h.output() {
            out.push(String::from_utf8(r.value.clone()).unwrap());
            let w: i64 = json_field(std::str::from_utf8(&r.value).unwrap(), "end").unwrap().parse().unwrap();
            assert_eq!(r.timestamp, w - 1, "a window's output carries its max timestamp");
        }
        late += h.side_output("late").len();
        assert_eq!(h.keyed_state_len(), 0, "every window cleaned up");
    }
    out.sort();
    (out, late)
}

#[test]
fn output_matches_expected() {
    let (out, late) = run(1, None);
    assert_eq!(out, expected());
    assert_eq!(late, 0);
}

#[test]
fn output_is_the_same_on_three_subtasks() {
    assert_eq!(run(3, None).0, expected());
}

#[test]
fn a_late_record_goes_to_the_late_side_output() {
    let (out, late) = run(1, Some((r#"{"ts": 100, "category": "fruit", "item": "apple"}"#, 100)));
    assert_eq!(out, expected());
    assert_eq!(late, 1);
}

#[test]
fn bad_lines_are_rejected_and_bad_roles_fail() {
    let mut key = Harness::new(Example::default(), opts("key", 0, 1));
    key.open().unwrap();
    let e = key.process_element(&Record::new(b"", br#"{"ts": 1, "item": "x"}"#, 1), 0).unwrap_err();
    assert!(e.is_rejection() && e.message().contains("no field \"category\""), "{}", e);
    let mut bad = Harness::new(Example::default(), opts("sum", 0, 1));
    let e = bad.open().unwrap_err();
    assert!(e.message().contains("config role must be"), "{}", e);
}

#[test]
fn json_fields() {
    let l = r#"{"ts": 12, "category":"a \"b\"", "item" : "x,y"}"#;
    assert_eq!(json_field(l, "ts").as_deref(), Some("12"));
    assert_eq!(json_field(l, "category").as_deref(), Some("a \"b\""));
    assert_eq!(json_field(l, "item").as_deref(), Some("x,y"));
    assert_eq!(json_field(l, "none"), None);
}
