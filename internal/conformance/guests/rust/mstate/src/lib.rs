//! The structured-state conformance operator "mstate" (../../SPEC.md) with
//! the Rust SDK: each record's value is a command on the record's key (the
//! SDK's current key), run with `streamd::state::raw` and the timer and
//! clock functions. The WAT and Go guests behave the same.

use streamd::state::raw;
use streamd::{timer, Context, Operator, Record, Result};

/// The operator; it keeps nothing itself.
pub struct MState;

/// The command's fields: each `u32le len, bytes`; missing ones are empty.
fn fields(mut b: &[u8]) -> Result<[Vec<u8>; 4]> {
    let mut out: [Vec<u8>; 4] = Default::default();
    for f in out.iter_mut() {
        if b.is_empty() {
            break;
        }
        if b.len() < 4 {
            return Err("mstate: truncated field length".into());
        }
        let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if b.len() - 4 < n {
            return Err("mstate: field runs past the command".into());
        }
        *f = b[4..4 + n].to_vec();
        b = &b[4 + n..];
    }
    Ok(out)
}

fn text(b: &[u8]) -> Result<&str> {
    Ok(std::str::from_utf8(b)?)
}

fn i64le(b: &[u8]) -> Result<i64> {
    if b.len() != 8 {
        return Err(format!("mstate: want an i64le field, got {} bytes", b.len()).into());
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Ok(i64::from_le_bytes(a))
}

fn emit_result(key: &[u8], tag: u8, r: Option<Vec<u8>>, ts: i64) {
    streamd::emit_with(key, ts, |out| {
        out.push(tag);
        match &r {
            Some(v) => {
                out.write_bytes(&(v.len() as i32).to_le_bytes());
                out.write_bytes(v);
            }
            None => out.write_bytes(&(-1i32).to_le_bytes()),
        }
    })
}

impl Operator for MState {
    fn open(&mut self, _ctx: &Context) -> Result<()> {
        raw::set_ttl("ttl", 100, 0);
        raw::set_ttl("ttlr", 100, 1);
        Ok(())
    }

    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let (k, ts) = (rec.key, rec.timestamp);
        let op = match rec.value.first() {
            Some(op) => *op,
            None => return Err("mstate: empty command".into()),
        };
        let [a, b, c, d] = fields(&rec.value[1..])?;
        match op {
            b'g' => emit_result(k, b'g', raw::get(text(&a)?, &b, &c), ts),
            b'e' => emit_result(k, b'e', raw::entries(text(&a)?, &b), ts),
            b'p' => raw::put(text(&a)?, &b, &c, &d),
            b'a' => raw::append(text(&a)?, &b, &c, &d),
            b'r' => raw::remove(text(&a)?, &b, &c),
            b'c' => raw::clear(text(&a)?, &b),
            b'P' => timer::register_processing_time(i64le(&a)?),
            b'D' => timer::delete_processing_time(i64le(&a)?),
            b'n' => {
                let now = streamd::current_processing_time();
                streamd::emit_with(k, ts, |out| {
                    out.push(b'n');
                    out.write_bytes(&now.to_le_bytes());
                })
            }
            b'o' => raw::v1_put(text(&a)?, &b),
            b't' => raw::set_ttl(text(&a)?, i64le(&b)?, 0),
            b'x' => return Err(streamd::reject("mstate reject")),
            op => streamd::fail(&format!("mstate: unknown command {:?}", op as char)),
        }
        Ok(())
    }

    fn on_processing_time(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        streamd::emit_with(key, ts, |out| {
            out.write_bytes(b"pt");
            out.write_bytes(&ts.to_le_bytes());
        });
        Ok(())
    }
}

streamd::export_operator!(MState, MState);
