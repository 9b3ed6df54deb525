//! The host imports of module `streamd_v1`, wrapped in safe functions.
//!
//! On wasm32 these are the real imports. On any other target (native `cargo
//! test`) they are an in-memory fake host, so the codec, the emit buffer and
//! the state helpers can be unit-tested without a Wasm runtime.

#[cfg(target_arch = "wasm32")]
mod imp {
    #[link(wasm_import_module = "streamd_v1")]
    extern "C" {
        #[link_name = "emit"]
        fn host_emit(batch_ptr: *const u8, batch_len: usize);
        #[link_name = "state_get"]
        fn host_state_get(
            name_ptr: *const u8,
            name_len: usize,
            key_ptr: *const u8,
            key_len: usize,
            buf_ptr: *mut u8,
            buf_cap: usize,
        ) -> i32;
        #[link_name = "state_put"]
        fn host_state_put(
            name_ptr: *const u8,
            name_len: usize,
            key_ptr: *const u8,
            key_len: usize,
            val_ptr: *const u8,
            val_len: usize,
        );
        #[link_name = "state_delete"]
        fn host_state_delete(name_ptr: *const u8, name_len: usize, key_ptr: *const u8, key_len: usize);
        #[link_name = "list_state_add"]
        fn host_list_state_add(name_ptr: *const u8, name_len: usize, mode: i32, val_ptr: *const u8, val_len: usize);
        #[link_name = "list_state_get"]
        fn host_list_state_get(name_ptr: *const u8, name_len: usize, index: i32, buf_ptr: *mut u8, buf_cap: usize) -> i32;
        #[link_name = "timer_register"]
        fn host_timer_register(key_ptr: *const u8, key_len: usize, ts: i64);
        #[link_name = "timer_delete"]
        fn host_timer_delete(key_ptr: *const u8, key_len: usize, ts: i64);
        #[link_name = "current_watermark"]
        fn host_current_watermark() -> i64;
        #[link_name = "log"]
        fn host_log(level: i32, msg_ptr: *const u8, msg_len: usize);
        #[link_name = "fail"]
        fn host_fail(msg_ptr: *const u8, msg_len: usize);
        #[link_name = "reject"]
        fn host_reject(msg_ptr: *const u8, msg_len: usize);
    }

    /// The reason of the REJECT status the current `streamd_process` returns.
    pub fn reject(msg: &str) {
        unsafe { host_reject(msg.as_ptr(), msg.len()) }
    }

    pub fn emit(frame: &[u8]) {
        unsafe { host_emit(frame.as_ptr(), frame.len()) }
    }

    /// Reads keyed state into `buf[..cap]`; see ABI.md for the -1 / n > cap contract.
    pub fn state_get(name: &[u8], key: &[u8], buf: *mut u8, cap: usize) -> i32 {
        unsafe { host_state_get(name.as_ptr(), name.len(), key.as_ptr(), key.len(), buf, cap) }
    }

    pub fn state_put(name: &[u8], key: &[u8], value: &[u8]) {
        unsafe { host_state_put(name.as_ptr(), name.len(), key.as_ptr(), key.len(), value.as_ptr(), value.len()) }
    }

    pub fn state_delete(name: &[u8], key: &[u8]) {
        unsafe { host_state_delete(name.as_ptr(), name.len(), key.as_ptr(), key.len()) }
    }

    pub fn list_state_add(name: &[u8], mode: i32, value: &[u8]) {
        unsafe { host_list_state_add(name.as_ptr(), name.len(), mode, value.as_ptr(), value.len()) }
    }

    pub fn list_state_get(name: &[u8], index: i32, buf: *mut u8, cap: usize) -> i32 {
        unsafe { host_list_state_get(name.as_ptr(), name.len(), index, buf, cap) }
    }

    pub fn timer_register(key: &[u8], ts: i64) {
        unsafe { host_timer_register(key.as_ptr(), key.len(), ts) }
    }

    pub fn timer_delete(key: &[u8], ts: i64) {
        unsafe { host_timer_delete(key.as_ptr(), key.len(), ts) }
    }

    pub fn current_watermark() -> i64 {
        unsafe { host_current_watermark() }
    }

    pub fn log(level: i32, msg: &str) {
        unsafe { host_log(level, msg.as_ptr(), msg.len()) }
    }

    pub fn fail(msg: &str) -> ! {
        unsafe { host_fail(msg.as_ptr(), msg.len()) };
        // The host never returns from fail; trap if it ever does.
        core::arch::wasm32::unreachable()
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    //! A fake host for native unit tests, one per test thread.
    use std::cell::RefCell;
    use std::collections::{BTreeMap, BTreeSet};

    #[derive(Default)]
    pub struct FakeHost {
        pub frames: Vec<Vec<u8>>,
        pub state: BTreeMap<(Vec<u8>, Vec<u8>), Vec<u8>>,
        pub lists_added: Vec<(Vec<u8>, i32, Vec<u8>)>,
        pub lists_restored: BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
        pub timers: BTreeSet<(i64, Vec<u8>)>,
        pub watermark: i64,
        pub logs: Vec<(i32, String)>,
        pub rejects: Vec<String>,
    }

    thread_local! {
        pub static HOST: RefCell<FakeHost> = RefCell::new(FakeHost { watermark: i64::MIN, ..FakeHost::default() });
    }

    fn copy_out(v: &[u8], buf: *mut u8, cap: usize) -> i32 {
        if v.len() <= cap {
            unsafe { core::ptr::copy_nonoverlapping(v.as_ptr(), buf, v.len()) };
        }
        v.len() as i32
    }

    pub fn emit(frame: &[u8]) {
        HOST.with(|h| h.borrow_mut().frames.push(frame.to_vec()))
    }
    pub fn state_get(name: &[u8], key: &[u8], buf: *mut u8, cap: usize) -> i32 {
        HOST.with(|h| match h.borrow().state.get(&(name.to_vec(), key.to_vec())) {
            Some(v) => copy_out(v, buf, cap),
            None => -1,
        })
    }
    pub fn state_put(name: &[u8], key: &[u8], value: &[u8]) {
        HOST.with(|h| h.borrow_mut().state.insert((name.to_vec(), key.to_vec()), value.to_vec()));
    }
    pub fn state_delete(name: &[u8], key: &[u8]) {
        HOST.with(|h| h.borrow_mut().state.remove(&(name.to_vec(), key.to_vec())));
    }
    pub fn list_state_add(name: &[u8], mode: i32, value: &[u8]) {
        HOST.with(|h| h.borrow_mut().lists_added.push((name.to_vec(), mode, value.to_vec())))
    }
    pub fn list_state_get(name: &[u8], index: i32, buf: *mut u8, cap: usize) -> i32 {
        HOST.with(|h| match h.borrow().lists_restored.get(name).and_then(|l| l.get(index as usize)) {
            Some(v) => copy_out(v, buf, cap),
            None => -1,
        })
    }
    pub fn timer_register(key: &[u8], ts: i64) {
        HOST.with(|h| h.borrow_mut().timers.insert((ts, key.to_vec())));
    }
    pub fn timer_delete(key: &[u8], ts: i64) {
        HOST.with(|h| h.borrow_mut().timers.remove(&(ts, key.to_vec())));
    }
    pub fn current_watermark() -> i64 {
        HOST.with(|h| h.borrow().watermark)
    }
    pub fn log(level: i32, msg: &str) {
        HOST.with(|h| h.borrow_mut().logs.push((level, msg.to_string())))
    }
    pub fn fail(msg: &str) -> ! {
        panic!("streamd fail: {}", msg)
    }
    pub fn reject(msg: &str) {
        HOST.with(|h| h.borrow_mut().rejects.push(msg.to_string()))
    }
}

pub use imp::*;
