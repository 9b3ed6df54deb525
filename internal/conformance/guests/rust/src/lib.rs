//! The conformance operator (plan/conformance.md) written with the Rust SDK.
//! The Go and WAT guests behave the same; one harness checks all three.
//! It exercises the ABI v1 imports on purpose, so it keeps the deprecated
//! key-taking state and timer calls.
#![allow(deprecated)]

use core::ptr::read_volatile;
use streamd::{list_state, log, timer, Context, ListMode, Operator, Record, Result, ValueState, NO_TIMESTAMP};

const COUNT: ValueState = ValueState::new("count");

/// The conformance operator; `total` counts the records it counted.
pub struct Conformance {
    total: u64,
}

fn u64le(b: &[u8]) -> Result<u64> {
    if b.len() != 8 {
        return Err(format!("conformance: list state entry of {} bytes, want 8", b.len()).into());
    }
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Ok(u64::from_le_bytes(a))
}

impl Operator for Conformance {
    fn open(&mut self, ctx: &Context) -> Result<()> {
        self.total = 0;
        for e in list_state::entries("total") {
            self.total += u64le(&e)?;
        }
        if ctx.config("fail_in") == Some("open") {
            streamd::fail("conformance: fail in open");
        }
        log::info("open");
        Ok(())
    }

    fn process_element(&mut self, rec: &Record<'_>, input: u32) -> Result<()> {
        let (k, v, ts) = (rec.key, rec.value, rec.timestamp);
        match v {
            b"panic" => panic!("conformance panic"),
            b"reject" => return Err(streamd::reject("conformance reject")),
            b"oob" => {
                let b = unsafe { read_volatile(0xFFFF_FFF0usize as *const u8) };
                return Err(format!("conformance: read {} out of bounds without a trap", b).into());
            }
            b"spin" => {
                let x = 0u8;
                loop {
                    unsafe { read_volatile(&x) };
                }
            }
            b"grow" => loop {
                std::mem::forget(vec![1u8; 1 << 20]);
            },
            b"del" => {
                COUNT.delete(k);
                streamd::emit(k, b"del", ts);
                return Ok(());
            }
            b"timer" => timer::register(k, ts.wrapping_add(10)),
            _ => {}
        }
        let count = COUNT.get_u64(k)?.unwrap_or(0) + 1;
        COUNT.put_u64(k, count);
        self.total += 1;
        streamd::emit_with(k, ts, |out| {
            out.write_bytes(v);
            out.push(input as u8);
            out.write_bytes(&count.to_le_bytes());
        });
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        streamd::emit(key, b"timer", ts);
        Ok(())
    }

    fn on_watermark(&mut self, ts: i64) -> Result<()> {
        streamd::emit(b"", b"wm", ts);
        Ok(())
    }

    fn end_input(&mut self, input: u32) -> Result<()> {
        streamd::emit(b"", &[b'e', b'n', b'd', input as u8], NO_TIMESTAMP);
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        let total = self.total;
        streamd::emit_with(b"", NO_TIMESTAMP, |out| {
            out.write_bytes(b"finish");
            out.write_bytes(&total.to_le_bytes());
        });
        Ok(())
    }

    fn snapshot_state(&mut self, checkpoint_id: i64) -> Result<()> {
        list_state::add("total", ListMode::Split, &self.total.to_le_bytes());
        list_state::add("ckpt", ListMode::Union, &checkpoint_id.to_le_bytes());
        Ok(())
    }

    fn notify_checkpoint_complete(&mut self, _checkpoint_id: i64) -> Result<()> {
        log::info("notify");
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        log::info("close");
        Ok(())
    }
}

streamd::export_operator!(Conformance, Conformance { total: 0 });
