//! Native unit tests against the fake host of `sys` (one per test thread).

use crate::frame::{decode_batch_owned, encode_batch, Batch, FrameError};
use crate::testing::sim::with as host;
use crate::*;

fn take_frames() -> Vec<Vec<(Vec<u8>, Vec<u8>, i64)>> {
    host(|h| std::mem::take(&mut h.frames))
        .iter()
        .map(|f| decode_batch_owned(f).expect("emitted frame decodes"))
        .collect()
}

#[test]
fn batch_round_trip() {
    let recs = [
        Record::new(b"k1", b"hello", 42),
        Record::new(b"", b"", NO_TIMESTAMP),
        Record::new(b"key-3", &[0xff; 300], -7),
    ];
    let frame = encode_batch(&recs);
    let b = Batch::parse(&frame).unwrap();
    assert_eq!(b.len(), 3);
    let got: Vec<Record> = b.iter().collect();
    assert_eq!(&got[..], &recs[..]);
    assert!(!got[1].has_key() && !got[1].has_timestamp());
    assert!(Batch::parse(&encode_batch(&[])).unwrap().is_empty());
}

#[test]
fn batch_rejects_malformed_frames() {
    let frame = encode_batch(&[Record::new(b"k", b"value", 1)]);
    assert_eq!(Batch::parse(&frame[..2]).unwrap_err(), FrameError::Truncated { at: 0, what: "record count" });
    // Every strict prefix is invalid, and so is a trailing byte.
    for n in 4..frame.len() {
        assert!(Batch::parse(&frame[..n]).is_err(), "prefix of {} bytes accepted", n);
    }
    let mut long = frame.clone();
    long.push(0);
    assert_eq!(Batch::parse(&long).unwrap_err(), FrameError::Trailing { bytes: 1 });
    // A huge count must be refused before looping.
    let mut huge = frame.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(Batch::parse(&huge).unwrap_err(), FrameError::CountTooLarge { .. }));
    // A key length past the end.
    let mut bad = frame;
    bad[12..16].copy_from_slice(&1000u32.to_le_bytes());
    assert!(matches!(Batch::parse(&bad).unwrap_err(), FrameError::LengthOutOfBounds { what: "key", .. }));
}

#[test]
fn headers_round_trip_and_pass_through() {
    let mut h = Vec::new();
    append_header(&mut h, b"trace", b"t1");
    append_header(&mut h, b"empty", b"");
    append_header(&mut h, b"trace", b"t2");
    let hd = Headers::new(&h).unwrap();
    assert_eq!(hd.len(), 3);
    assert_eq!(hd.get(b"trace"), Some(&b"t1"[..]));
    assert_eq!(hd.get(b"empty"), Some(&b""[..]));
    assert_eq!(hd.get(b"none"), None);
    let all: Vec<(&[u8], &[u8])> = hd.iter().collect();
    assert_eq!(all, vec![(&b"trace"[..], &b"t1"[..]), (&b"empty"[..], &b""[..]), (&b"trace"[..], &b"t2"[..])]);
    assert!(Headers::new(&h[..h.len() - 1]).is_err());

    let recs = [Record::new(b"k", b"v", 3).with_headers(hd), Record::new(b"", b"plain", NO_TIMESTAMP)];
    let frame = encode_batch(&recs);
    // The first record's key length carries the flag.
    assert_eq!(u32::from_le_bytes(frame[12..16].try_into().unwrap()), frame::HEADERS_FLAG | 1);
    let b = Batch::parse(&frame).unwrap();
    let got: Vec<Record> = b.iter().collect();
    assert_eq!(&got[..], &recs[..]);
    assert!(got[1].headers.is_empty());
    for n in 4..frame.len() {
        assert!(Batch::parse(&frame[..n]).is_err(), "prefix of {} bytes accepted", n);
    }
    // A header entry that runs past its block.
    let mut bad = frame.clone();
    let at = 4 + 16 + 1 + 1 + 4;
    bad[at..at + 4].copy_from_slice(&100u32.to_le_bytes());
    assert!(Batch::parse(&bad).is_err());

    // emit_record keeps them, emit and a Filter's output too.
    let _ = host(|h| std::mem::take(&mut h.frames));
    emit_record(&got[0]);
    emit(got[0].key, got[0].value, got[0].timestamp);
    Filter((|_: &Record| true) as helpers::FilterFn).process_element(&got[0], 0).unwrap();
    emit_with_headers(got[0].key, got[0].timestamp, got[0].headers, |v| v.extend(b"written".iter().copied()));
    flush();
    let frames = host(|h| std::mem::take(&mut h.frames));
    let out: Vec<OwnedRecord> = frames.iter().flat_map(|f| frame::decode_records_owned(f).unwrap()).collect();
    assert_eq!(out.len(), 4);
    assert_eq!(out[0].headers, h);
    assert!(out[1].headers.is_empty());
    assert_eq!(out[2].headers, h);
    assert_eq!((out[3].value.as_slice(), out[3].headers.as_slice(), out[3].timestamp), (&b"written"[..], h.as_slice(), 3));
    assert_eq!(out[0].as_record(), got[0]);
}

#[test]
fn context_round_trip_and_config() {
    let c = Context {
        subtask: 1,
        parallelism: 4,
        max_parallelism: 128,
        attempt: 2,
        num_inputs: 1,
        restored: true,
        job: "wc".into(),
        operator: "count".into(),
        config: vec![
            ("min_length".into(), "3".into()),
            ("flag".into(), "true".into()),
            ("bad".into(), "x".into()),
        ],
    };
    let d = Context::decode(&c.encode()).unwrap();
    assert_eq!(d, c);
    assert_eq!(d.config_u64_or("min_length", 1).unwrap(), 3);
    assert_eq!(d.config_u64_or("absent", 1).unwrap(), 1);
    assert!(d.config_bool_or("flag", false).unwrap());
    let e = d.config_u64("bad").unwrap_err();
    assert!(e.message().contains("\"bad\"") && e.message().contains("count"), "{}", e);
    assert!(d.config_bool("bad").is_err());
    let mut enc = c.encode();
    enc.push(9);
    assert_eq!(Context::decode(&enc).unwrap_err(), FrameError::Trailing { bytes: 1 });
    enc[0] = 2;
    assert_eq!(Context::decode(&enc).unwrap_err(), FrameError::Version { got: 2 });
}

#[test]
fn emits_are_buffered_in_order_and_flushed() {
    take_frames();
    emit(b"a", b"1", 1);
    emit_with(b"b", 2, |v| {
        use core::fmt::Write;
        write!(v, "{} {}", "x", 42).unwrap()
    });
    emit_record(&Record::new(b"", b"up", NO_TIMESTAMP));
    assert!(take_frames().is_empty(), "nothing is sent before flush");
    flush();
    flush();
    let f = take_frames();
    assert_eq!(f.len(), 1);
    assert_eq!(
        f[0],
        vec![
            (b"a".to_vec(), b"1".to_vec(), 1),
            (b"b".to_vec(), b"x 42".to_vec(), 2),
            (vec![], b"up".to_vec(), NO_TIMESTAMP)
        ]
    );
}

#[test]
fn large_output_is_flushed_in_frames_of_about_64k() {
    take_frames();
    let v = [7u8; 1000];
    for i in 0..200u32 {
        emit(&i.to_le_bytes(), &v, i as i64);
    }
    flush();
    let f = take_frames();
    assert!(f.len() >= 3, "{} frames", f.len());
    let all: Vec<_> = f.concat();
    assert_eq!(all.len(), 200);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.0, (i as u32).to_le_bytes());
        assert_eq!(r.2, i as i64);
    }
}

#[test]
#[allow(deprecated)]
fn value_state_and_u64_helpers() {
    const COUNT: ValueState = ValueState::new("count");
    assert_eq!(COUNT.get_u64(b"w").unwrap(), None);
    COUNT.put_u64(b"w", 41);
    assert_eq!(COUNT.get_u64(b"w").unwrap(), Some(41));
    COUNT.put(b"w", &[1; 100]);
    assert!(COUNT.get_u64(b"w").is_err());
    let mut buf = Vec::with_capacity(4);
    assert!(COUNT.get_into(b"w", &mut buf));
    assert_eq!(buf, vec![1; 100]);
    // The typed API of the current key reads the same v1 state.
    assert_eq!(with_key(b"w", || COUNT.get()), Some(vec![1; 100]));
    COUNT.delete(b"w");
    assert_eq!(COUNT.get_key(b"w"), None);
}

#[test]
fn list_state_entries() {
    host(|h| {
        h.lists_restored.insert(b"total".to_vec(), vec![vec![1; 8], vec![2; 3000]]);
    });
    let e = list_state::entries("total");
    assert_eq!(e, vec![vec![1; 8], vec![2; 3000]]);
    assert!(list_state::entries("none").is_empty());
    crate::keyed::in_phase("snapshot_state", || list_state::add("ckpt", ListMode::Union, b"x"));
    host(|h| assert_eq!(h.lists_added, vec![(b"ckpt".to_vec(), 1, b"x".to_vec())]));
}

#[test]
fn stateless_helpers_emit_what_their_functions_return() {
    fn upper(r: &Record) -> OwnedRecord {
        OwnedRecord::new(r.key, &r.value.to_ascii_uppercase(), r.timestamp + 1)
    }
    fn long(r: &Record) -> bool {
        r.value.len() > 2
    }
    fn words(r: &Record, out: &mut Collector) {
        for w in r.value.split(|b| *b == b' ').filter(|w| !w.is_empty()) {
            out.emit(w, b"1", r.timestamp);
        }
    }
    let _ = take_frames();
    let recs = [Record::new(b"k", b"ab", 1), Record::new(b"", b"a bc", 2)];
    let mut m = Map(upper as helpers::MapFn);
    let mut f = Filter(long as helpers::FilterFn);
    let mut fm = FlatMap(words as helpers::FlatMapFn);
    for r in &recs {
        m.process_element(r, 0).unwrap();
        f.process_element(r, 0).unwrap();
        fm.process_element(r, 0).unwrap();
    }
    flush();
    let got: Vec<(Vec<u8>, Vec<u8>, i64)> = take_frames().into_iter().flatten().collect();
    let want: Vec<(Vec<u8>, Vec<u8>, i64)> = vec![
        (b"k".to_vec(), b"AB".to_vec(), 2),
        (b"ab".to_vec(), b"1".to_vec(), 1),
        (b"".to_vec(), b"A BC".to_vec(), 3),
        (b"".to_vec(), b"a bc".to_vec(), 2),
        (b"a".to_vec(), b"1".to_vec(), 2),
        (b"bc".to_vec(), b"1".to_vec(), 2),
    ];
    assert_eq!(got, want);
}

struct Rejecter;

impl Operator for Rejecter {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        emit(b"", b"dropped", NO_TIMESTAMP);
        if rec.value == b"bad" {
            return Err(reject(format!("value {:?} is bad", "bad")));
        }
        Ok(())
    }
}

crate::__rt::thread_local! {
    static REJECTER: core::cell::RefCell<Option<Rejecter>> = const { core::cell::RefCell::new(None) };
}

/// Runs `streamd_process` on `recs` (a native pointer does not fit an i32:
/// the frame is passed as a slice).
fn process_rejecter(recs: &[Record<'_>]) -> i32 {
    crate::__rt::process_data(&REJECTER, 0, &encode_batch(recs))
}

#[test]
fn reject_returns_status_reject_with_the_reason() {
    take_frames();
    REJECTER.with(|s| *s.borrow_mut() = Some(Rejecter));
    let st = process_rejecter(&[Record::new(b"", b"ok", 1), Record::new(b"", b"bad", 2)]);
    assert_eq!(st, crate::__rt::REJECT);
    assert!(take_frames().is_empty(), "a rejected batch emits nothing");
    host(|h| assert_eq!(h.rejects.drain(..).collect::<Vec<_>>(), vec!["value \"bad\" is bad".to_string()]));
    assert_eq!(process_rejecter(&[Record::new(b"", b"ok", 1)]), crate::__rt::OK);
    assert!(reject("x").is_rejection() && !Error::new("x").is_rejection());
}

#[test]
fn codecs_round_trip_and_reuse_buffers() {
    fn rt<C: Codec>(v: C::Item) -> C::Item {
        let mut b = Vec::new();
        C::encode(&v, &mut b);
        C::decode(&b).unwrap()
    }
    assert_eq!(rt::<I64>(-5), -5);
    assert_eq!(rt::<F64>(2.5), 2.5);
    assert_eq!(rt::<Str>("déjà".into()), "déjà");
    assert_eq!(rt::<Bytes>(vec![0, 255]), vec![0, 255]);
    assert!(I64::decode(b"abc").unwrap_err().message().contains("3 bytes, want 8"));
    let long = "x".repeat(40) + "é" + &"y".repeat(40);
    assert!(codec::check_utf8(long.as_bytes()).is_ok());
    let mut bad = long.clone().into_bytes();
    bad[41] = b'z'; // the second byte of é
    assert_eq!(Str::decode(&bad).unwrap_err().message(), "not UTF-8: invalid byte at 40");
    let buf = Vec::with_capacity(64);
    let p = buf.as_ptr();
    let s = Str::decode_reusing(b"hello", buf).unwrap();
    assert_eq!((s.as_str(), s.as_ptr()), ("hello", p), "decoded into the spare buffer");
    assert_eq!(Str::recycle(s).map(|b| b.as_ptr()), Some(p));
    assert_eq!(I64::recycle(3), None);
}

#[test]
fn is_ascii_sees_every_byte() {
    // Every length around the lane sizes, a high byte at every position
    // (the overlapping last lane and the short paths included).
    for n in 0..100 {
        let mut b = vec![b'a'; n];
        assert!(codec::is_ascii(&b), "all ASCII, {} bytes", n);
        for i in 0..n {
            b[i] = 0x80;
            assert!(!codec::is_ascii(&b), "0x80 at {} of {}", i, n);
            assert!(!codec::is_ascii(&b[..i + 1]) && codec::is_ascii(&b[..i]));
            b[i] = 0x7f;
        }
    }
}
