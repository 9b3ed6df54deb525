//! The current key and the lifecycle phase the SDK is in (SPEC14 section 4):
//! in `process_element` the record's key, in `on_timer`/`on_processing_time`
//! the timer's key, elsewhere none. Keyed state and timers use it.

use core::cell::Cell;

#[derive(Clone, Copy)]
struct Cur {
    /// The key's bytes: they live in the SDK's input buffer (or the harness's
    /// record) for the whole lifecycle call that set them.
    ptr: *const u8,
    len: usize,
    set: bool,
}

thread_local! {
    static CUR: Cell<Cur> = const { Cell::new(Cur { ptr: core::ptr::null(), len: 0, set: false }) };
    static PHASE: Cell<&'static str> = const { Cell::new("load") };
}

/// Runs `f` with `key` as the current key, then restores the previous one.
///
/// The SDK does this around every `process_element` (the default
/// `process_batch`), `on_timer` and `on_processing_time`; an operator that
/// overrides `process_batch` calls it per record itself:
///
/// ```ignore
/// for rec in batch { streamd::with_key(rec.key, || self.count(&rec))?; }
/// ```
#[inline]
pub fn with_key<R>(key: &[u8], f: impl FnOnce() -> R) -> R {
    scoped(Cur { ptr: key.as_ptr(), len: key.len(), set: true }, f)
}

/// Runs `f` with no current key (e.g. `on_watermark`).
pub(crate) fn without_key<R>(f: impl FnOnce() -> R) -> R {
    scoped(Cur { ptr: core::ptr::null(), len: 0, set: false }, f)
}

#[inline]
fn scoped<R>(cur: Cur, f: impl FnOnce() -> R) -> R {
    struct Restore(Cur);
    impl Drop for Restore {
        fn drop(&mut self) {
            CUR.with(|c| c.set(self.0));
        }
    }
    let _r = Restore(CUR.with(|c| c.replace(cur)));
    f()
}

/// Calls `f` with the current key, or `None` outside a keyed call.
#[inline]
pub(crate) fn key_ref<R>(f: impl FnOnce(Option<&[u8]>) -> R) -> R {
    let c = CUR.with(|c| c.get());
    if !c.set {
        return f(None);
    }
    // Valid: see `Cur::ptr`; the slice does not escape `f`.
    let k = if c.len == 0 { &[][..] } else { unsafe { core::slice::from_raw_parts(c.ptr, c.len) } };
    f(Some(k))
}

/// Calls `f` with the current key; fails the subtask when there is none or
/// it is empty ("state S: no current key in PHASE").
#[inline]
pub(crate) fn with_current<R>(what: &dyn core::fmt::Display, f: impl FnOnce(&[u8]) -> R) -> R {
    key_ref(|k| match k {
        Some(k) if !k.is_empty() => f(k),
        Some(_) => crate::fail(&format!("{}: the current record has no key (keyed state and timers need a keyed input)", what)),
        None => crate::fail(&format!("{}: no current key in {}", what, phase())),
    })
}

/// The current key: the record's in `process_element`, the timer's in
/// `on_timer` and `on_processing_time`, `None` elsewhere.
pub fn current_key() -> Option<Vec<u8>> {
    key_ref(|k| k.map(<[u8]>::to_vec))
}

/// The lifecycle call the SDK is in ("open", "process", "on_timer", ...).
pub fn phase() -> &'static str {
    PHASE.with(|p| p.get())
}

/// Runs `f` in phase `p`, then restores the previous phase.
pub(crate) fn in_phase<R>(p: &'static str, f: impl FnOnce() -> R) -> R {
    let prev = PHASE.with(|c| c.replace(p));
    struct Restore(&'static str);
    impl Drop for Restore {
        fn drop(&mut self) {
            PHASE.with(|c| c.set(self.0));
        }
    }
    let _r = Restore(prev);
    f()
}
