//! The glue behind [`crate::export_operator!`]: the exported lifecycle
//! functions call these. Not a public API.

use crate::frame::Batch;
use crate::keyed::{in_phase, with_key, without_key};
use crate::{emit, log, sys, Context, Operator, Result};
use core::cell::{Cell, RefCell};
use std::thread::LocalKey;

pub use std::thread_local;

/// Where the operator lives between calls (a per-module static).
pub type Slot<T> = LocalKey<RefCell<Option<T>>>;

/// Status codes of lifecycle exports.
pub const OK: i32 = 0;
/// The guest could not decode a frame the host passed.
pub const INVALID_INPUT: i32 = 2;
/// `streamd_process` only: a record of the batch is rejected ([`crate::reject`]).
pub const REJECT: i32 = 3;

thread_local! {
    /// The input buffer lent to the host by `streamd_alloc`.
    static INPUT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static HOOKED: Cell<bool> = const { Cell::new(false) };
}

/// Installs the panic hook on the first call into the module.
#[inline]
pub fn enter() {
    HOOKED.with(|h| {
        if !h.get() {
            h.set(true);
            install_hook();
        }
    })
}

#[cfg(target_arch = "wasm32")]
fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        // "panicked at 'msg', src/lib.rs:10:5"; fail never returns, so the
        // abort that follows a panic=abort panic is never reached.
        let msg = info.to_string();
        sys::fail(&msg)
    }));
}

#[cfg(not(target_arch = "wasm32"))]
fn install_hook() {}

/// `streamd_alloc`: returns a buffer of at least `size` bytes, the same one
/// while it is big enough, or 0 when memory is exhausted.
pub fn alloc(size: i32) -> i32 {
    enter();
    if size < 0 {
        return 0;
    }
    let size = (size as usize).max(1);
    INPUT.with(|b| {
        let mut b = b.borrow_mut();
        if b.capacity() < size {
            // The old buffer is dead: a buffer lives until the next alloc call.
            *b = Vec::new();
            let want = size.checked_next_power_of_two().unwrap_or(size).max(64 * 1024);
            if b.try_reserve_exact(want).is_err() && b.try_reserve_exact(size).is_err() {
                return 0;
            }
        }
        b.as_mut_ptr() as usize as i32
    })
}

/// The host's data at `ptr..ptr+len`, which must lie inside the input buffer.
fn input<'a>(ptr: i32, len: i32, what: &str) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    let (p, n) = (ptr as u32 as usize, len as u32 as usize);
    let ok = INPUT.with(|b| {
        let b = b.borrow();
        let base = b.as_ptr() as usize;
        len > 0 && p >= base && p.checked_add(n).map_or(false, |end| end <= base + b.capacity())
    });
    if !ok {
        log::error(&format!(
            "streamd: {} at {:#x}+{} is not inside the buffer returned by streamd_alloc",
            what, p, len
        ));
        return None;
    }
    // The host wrote these bytes into our buffer; nothing reallocates it
    // before the current export returns (only the host calls streamd_alloc).
    Some(unsafe { core::slice::from_raw_parts(p as *const u8, n) })
}

fn finish_call(r: Result<()>, process: bool) -> i32 {
    match r {
        Ok(()) => {
            emit::flush();
            OK
        }
        Err(e) if process && e.is_rejection() => {
            emit::discard(); // the host replays the batch without the record
            sys::reject(e.message());
            REJECT
        }
        Err(e) => {
            emit::discard();
            sys::fail(e.message())
        }
    }
}

/// Runs `f` in lifecycle phase `phase` with `key` as the current key (none
/// when `None`). Shared by the exports and the native test harness.
pub(crate) fn run<R>(phase: &'static str, key: Option<&[u8]>, f: impl FnOnce() -> R) -> R {
    in_phase(phase, || match key {
        Some(k) => with_key(k, f),
        None => without_key(f),
    })
}

fn with_op<T: Operator + 'static>(
    slot: &'static Slot<T>,
    phase: &'static str,
    key: Option<&[u8]>,
    f: impl FnOnce(&mut T) -> Result<()>,
) -> i32 {
    enter();
    let r = slot.with(|s| match s.borrow_mut().as_mut() {
        Some(op) => run(phase, key, || f(op)),
        None => Err(format!("streamd: {} called before streamd_open", phase).into()),
    });
    finish_call(r, phase == "process")
}

/// `streamd_open`.
pub fn open<T: Operator + 'static>(slot: &'static Slot<T>, ptr: i32, len: i32, new: impl FnOnce() -> T) -> i32 {
    enter();
    let data = match input(ptr, len, "open context") {
        Some(d) => d,
        None => return INVALID_INPUT,
    };
    let ctx = match Context::decode(data) {
        Ok(c) => c,
        Err(e) => {
            log::error(&format!("streamd: streamd_open: {}", e));
            return INVALID_INPUT;
        }
    };
    let op = new();
    slot.with(|s| *s.borrow_mut() = Some(op));
    with_op(slot, "open", None, |op| op.open(&ctx))
}

/// `streamd_process`.
pub fn process<T: Operator + 'static>(slot: &'static Slot<T>, input_index: i32, ptr: i32, len: i32) -> i32 {
    enter();
    let data = match input(ptr, len, "batch") {
        Some(d) => d,
        None => return INVALID_INPUT,
    };
    process_data(slot, input_index, data)
}

/// `streamd_process` on the batch frame `data`.
pub(crate) fn process_data<T: Operator + 'static>(slot: &'static Slot<T>, input_index: i32, data: &[u8]) -> i32 {
    let batch = match Batch::parse(data) {
        Ok(b) => b,
        Err(e) => {
            log::error(&format!("streamd: streamd_process(input {}): {}", input_index, e));
            return INVALID_INPUT;
        }
    };
    with_op(slot, "process", None, |op| op.process_batch(&batch, input_index as u32))
}

/// `streamd_on_watermark`.
pub fn on_watermark<T: Operator + 'static>(slot: &'static Slot<T>, ts: i64) -> i32 {
    with_op(slot, "on_watermark", None, |op| op.on_watermark(ts))
}

/// `streamd_on_timer`.
pub fn on_timer<T: Operator + 'static>(slot: &'static Slot<T>, ts: i64, ptr: i32, len: i32) -> i32 {
    enter();
    let key = match input(ptr, len, "timer key") {
        Some(d) => d,
        None => return INVALID_INPUT,
    };
    with_op(slot, "on_timer", Some(key), |op| op.on_timer(ts, key))
}

/// `streamd_on_processing_time`.
pub fn on_processing_time<T: Operator + 'static>(slot: &'static Slot<T>, ts: i64, ptr: i32, len: i32) -> i32 {
    enter();
    let key = match input(ptr, len, "timer key") {
        Some(d) => d,
        None => return INVALID_INPUT,
    };
    with_op(slot, "on_processing_time", Some(key), |op| op.on_processing_time(ts, key))
}

/// `streamd_end_input`.
pub fn end_input<T: Operator + 'static>(slot: &'static Slot<T>, input_index: i32) -> i32 {
    with_op(slot, "end_input", None, |op| op.end_input(input_index as u32))
}

/// `streamd_finish`.
pub fn finish<T: Operator + 'static>(slot: &'static Slot<T>) -> i32 {
    with_op(slot, "finish", None, |op| op.finish())
}

/// `streamd_snapshot_state`.
pub fn snapshot_state<T: Operator + 'static>(slot: &'static Slot<T>, id: i64) -> i32 {
    with_op(slot, "snapshot_state", None, |op| op.snapshot_state(id))
}

/// `streamd_notify_checkpoint_complete`.
pub fn notify_checkpoint_complete<T: Operator + 'static>(slot: &'static Slot<T>, id: i64) -> i32 {
    with_op(slot, "notify_checkpoint_complete", None, |op| op.notify_checkpoint_complete(id))
}

/// `streamd_close`: closes and drops the operator; a close without open is OK.
pub fn close<T: Operator + 'static>(slot: &'static Slot<T>) -> i32 {
    enter();
    emit::discard();
    let op = slot.with(|s| s.borrow_mut().take());
    match op {
        Some(mut op) => {
            let r = run("close", None, || op.close());
            drop(op);
            finish_call(r, false)
        }
        None => OK,
    }
}

/// Exports an [`Operator`](crate::Operator) as a streamd guest module: every
/// `streamd_*` lifecycle function, `streamd_alloc` and `streamd_abi_version`.
/// `$new` is evaluated once, in `streamd_open`, before `Operator::open`.
///
/// ```ignore
/// streamd::export_operator!(WordCount, WordCount::new());
/// ```
///
/// Use it once per crate, at the crate root or in any module.
#[macro_export]
macro_rules! export_operator {
    ($ty:ty, $new:expr) => {
        $crate::__rt::thread_local! {
            static __STREAMD_OPERATOR: ::core::cell::RefCell<::core::option::Option<$ty>> =
                const { ::core::cell::RefCell::new(::core::option::Option::None) };
        }

        #[no_mangle]
        pub extern "C" fn streamd_abi_version() -> i32 {
            $crate::ABI_VERSION
        }

        #[no_mangle]
        pub extern "C" fn streamd_alloc(size: i32) -> i32 {
            $crate::__rt::alloc(size)
        }

        #[no_mangle]
        pub extern "C" fn streamd_open(ctx_ptr: i32, ctx_len: i32) -> i32 {
            $crate::__rt::open(&__STREAMD_OPERATOR, ctx_ptr, ctx_len, || -> $ty { $new })
        }

        #[no_mangle]
        pub extern "C" fn streamd_process(input: i32, batch_ptr: i32, batch_len: i32) -> i32 {
            $crate::__rt::process(&__STREAMD_OPERATOR, input, batch_ptr, batch_len)
        }

        #[no_mangle]
        pub extern "C" fn streamd_on_watermark(ts: i64) -> i32 {
            $crate::__rt::on_watermark(&__STREAMD_OPERATOR, ts)
        }

        #[no_mangle]
        pub extern "C" fn streamd_on_timer(ts: i64, key_ptr: i32, key_len: i32) -> i32 {
            $crate::__rt::on_timer(&__STREAMD_OPERATOR, ts, key_ptr, key_len)
        }

        #[no_mangle]
        pub extern "C" fn streamd_on_processing_time(ts: i64, key_ptr: i32, key_len: i32) -> i32 {
            $crate::__rt::on_processing_time(&__STREAMD_OPERATOR, ts, key_ptr, key_len)
        }

        #[no_mangle]
        pub extern "C" fn streamd_end_input(input: i32) -> i32 {
            $crate::__rt::end_input(&__STREAMD_OPERATOR, input)
        }

        #[no_mangle]
        pub extern "C" fn streamd_finish() -> i32 {
            $crate::__rt::finish(&__STREAMD_OPERATOR)
        }

        #[no_mangle]
        pub extern "C" fn streamd_snapshot_state(checkpoint_id: i64) -> i32 {
            $crate::__rt::snapshot_state(&__STREAMD_OPERATOR, checkpoint_id)
        }

        #[no_mangle]
        pub extern "C" fn streamd_notify_checkpoint_complete(checkpoint_id: i64) -> i32 {
            $crate::__rt::notify_checkpoint_complete(&__STREAMD_OPERATOR, checkpoint_id)
        }

        #[no_mangle]
        pub extern "C" fn streamd_close() -> i32 {
            $crate::__rt::close(&__STREAMD_OPERATOR)
        }

        /// Never called: the host passes record headers to a guest that
        /// exports it (abi/ABI.md, "Record headers").
        #[no_mangle]
        pub extern "C" fn streamd_record_headers() {}
    };
}

/// Exports the operator `$new` evaluates to, whatever its type (closures
/// included: window operators, typed helpers), boxed as a
/// `Box<dyn Operator>`: one dynamic call per lifecycle call (per batch,
/// not per record).
///
/// ```ignore
/// streamd::export_boxed_operator!(streamd::map_typed::<Str, Str, _>(|s: String| Ok(s.to_uppercase())));
/// ```
#[macro_export]
macro_rules! export_boxed_operator {
    ($new:expr) => {
        $crate::export_operator!(
            ::std::boxed::Box<dyn $crate::Operator>,
            ::std::boxed::Box::new($new) as ::std::boxed::Box<dyn $crate::Operator>
        );
    };
}
