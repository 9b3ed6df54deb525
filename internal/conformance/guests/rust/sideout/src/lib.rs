//! The watermark and side-output conformance operator "sideout" (../../SPEC.md)
//! with the Rust SDK: `emit_watermark`, `input_watermark` and `emit_to`. The
//! WAT and Go guests behave the same. The bad side-output name goes to the
//! import itself (`raw_emit_to`): the SDK refuses it before the host would.

use streamd::{Operator, Record, Result};

/// The operator: whether "wmfinish" was seen.
pub struct SideOut {
    wm_finish: bool,
}

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "streamd_v1")]
extern "C" {
    #[link_name = "emit_to"]
    fn host_emit_to(name: *const u8, name_len: usize, batch: *const u8, batch_len: usize);
}

/// Sends `rec` to side output `name` through the import, unchecked.
#[cfg(target_arch = "wasm32")]
fn raw_emit_to(name: &str, rec: &Record) {
    let mut b = Vec::new();
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&rec.timestamp.to_le_bytes());
    b.extend_from_slice(&(rec.key.len() as u32).to_le_bytes());
    b.extend_from_slice(rec.key);
    b.extend_from_slice(&(rec.value.len() as u32).to_le_bytes());
    b.extend_from_slice(rec.value);
    unsafe { host_emit_to(name.as_ptr(), name.len(), b.as_ptr(), b.len()) }
}

#[cfg(not(target_arch = "wasm32"))]
fn raw_emit_to(name: &str, rec: &Record) {
    streamd::emit_to(name, rec.key, rec.value, rec.timestamp)
}

impl Operator for SideOut {
    fn process_element(&mut self, rec: &Record, _input: u32) -> Result<()> {
        let v = rec.value;
        match v {
            b"wm" => streamd::emit_watermark(rec.timestamp),
            b"iw" => {
                let mut out = b"iw".to_vec();
                out.extend_from_slice(&streamd::input_watermark(0).to_le_bytes());
                out.extend_from_slice(&streamd::input_watermark(1).to_le_bytes());
                streamd::emit(rec.key, &out, rec.timestamp);
            }
            b"badin" => {
                streamd::input_watermark(7);
            }
            b"badname" => raw_emit_to("bad name", rec),
            b"wmfinish" => self.wm_finish = true,
            _ if matches!(v.last(), Some(b'1' | b'3' | b'5' | b'7' | b'9')) => {
                streamd::emit_to("side", rec.key, rec.value, rec.timestamp)
            }
            _ => streamd::emit(rec.key, rec.value, rec.timestamp),
        }
        Ok(())
    }

    fn on_watermark(&mut self, ts: i64) -> Result<()> {
        if ts != i64::MAX {
            streamd::emit_watermark(ts - 1000);
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if self.wm_finish {
            streamd::emit_watermark(0); // the host refuses it in finish
        }
        Ok(())
    }
}

streamd::export_operator!(SideOut, SideOut { wm_finish: false });
