//! The host imports of module `streamd_v1`, wrapped in safe functions.
//!
//! On wasm32 these are the real imports (a module imports only those it
//! uses: the linker drops the others). On any other target (native `cargo
//! test`) they go to the simulated host of [`crate::testing`].

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
        // SPEC14 section 1: structured keyed state.
        #[link_name = "mstate_get"]
        fn host_mstate_get(
            name_ptr: *const u8, name_len: usize, key_ptr: *const u8, key_len: usize,
            ns_ptr: *const u8, ns_len: usize, ukey_ptr: *const u8, ukey_len: usize,
            buf_ptr: *mut u8, buf_cap: usize,
        ) -> i32;
        #[link_name = "mstate_put"]
        fn host_mstate_put(
            name_ptr: *const u8, name_len: usize, key_ptr: *const u8, key_len: usize,
            ns_ptr: *const u8, ns_len: usize, ukey_ptr: *const u8, ukey_len: usize,
            val_ptr: *const u8, val_len: usize,
        );
        #[link_name = "mstate_append"]
        fn host_mstate_append(
            name_ptr: *const u8, name_len: usize, key_ptr: *const u8, key_len: usize,
            ns_ptr: *const u8, ns_len: usize, ukey_ptr: *const u8, ukey_len: usize,
            val_ptr: *const u8, val_len: usize,
        );
        #[link_name = "mstate_remove"]
        fn host_mstate_remove(
            name_ptr: *const u8, name_len: usize, key_ptr: *const u8, key_len: usize,
            ns_ptr: *const u8, ns_len: usize, ukey_ptr: *const u8, ukey_len: usize,
        );
        #[link_name = "mstate_entries"]
        fn host_mstate_entries(
            name_ptr: *const u8, name_len: usize, key_ptr: *const u8, key_len: usize,
            ns_ptr: *const u8, ns_len: usize, buf_ptr: *mut u8, buf_cap: usize,
        ) -> i32;
        #[link_name = "mstate_clear"]
        fn host_mstate_clear(name_ptr: *const u8, name_len: usize, key_ptr: *const u8, key_len: usize, ns_ptr: *const u8, ns_len: usize);
        #[link_name = "state_ttl"]
        fn host_state_ttl(name_ptr: *const u8, name_len: usize, ttl_ms: i64, flags: i32);
        // SPEC14 section 2: processing-time timers and the clock.
        #[link_name = "ptimer_register"]
        fn host_ptimer_register(key_ptr: *const u8, key_len: usize, ts: i64);
        #[link_name = "ptimer_delete"]
        fn host_ptimer_delete(key_ptr: *const u8, key_len: usize, ts: i64);
        #[link_name = "processing_time"]
        fn host_processing_time() -> i64;
        // SPEC14 section 3: watermarks and side outputs.
        #[link_name = "emit_watermark"]
        fn host_emit_watermark(ts: i64);
        #[link_name = "input_watermark"]
        fn host_input_watermark(input: i32) -> i64;
        #[link_name = "emit_to"]
        fn host_emit_to(name_ptr: *const u8, name_len: usize, batch_ptr: *const u8, batch_len: usize);
    }

    pub fn mstate_get(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8], buf: *mut u8, cap: usize) -> i32 {
        unsafe {
            host_mstate_get(name.as_ptr(), name.len(), key.as_ptr(), key.len(), ns.as_ptr(), ns.len(), ukey.as_ptr(), ukey.len(), buf, cap)
        }
    }

    pub fn mstate_put(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8], value: &[u8]) {
        unsafe {
            host_mstate_put(
                name.as_ptr(), name.len(), key.as_ptr(), key.len(), ns.as_ptr(), ns.len(),
                ukey.as_ptr(), ukey.len(), value.as_ptr(), value.len(),
            )
        }
    }

    pub fn mstate_append(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8], value: &[u8]) {
        unsafe {
            host_mstate_append(
                name.as_ptr(), name.len(), key.as_ptr(), key.len(), ns.as_ptr(), ns.len(),
                ukey.as_ptr(), ukey.len(), value.as_ptr(), value.len(),
            )
        }
    }

    pub fn mstate_remove(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8]) {
        unsafe { host_mstate_remove(name.as_ptr(), name.len(), key.as_ptr(), key.len(), ns.as_ptr(), ns.len(), ukey.as_ptr(), ukey.len()) }
    }

    pub fn mstate_entries(name: &[u8], key: &[u8], ns: &[u8], buf: *mut u8, cap: usize) -> i32 {
        unsafe { host_mstate_entries(name.as_ptr(), name.len(), key.as_ptr(), key.len(), ns.as_ptr(), ns.len(), buf, cap) }
    }

    pub fn mstate_clear(name: &[u8], key: &[u8], ns: &[u8]) {
        unsafe { host_mstate_clear(name.as_ptr(), name.len(), key.as_ptr(), key.len(), ns.as_ptr(), ns.len()) }
    }

    pub fn state_ttl(name: &[u8], ttl_ms: i64, flags: i32) {
        unsafe { host_state_ttl(name.as_ptr(), name.len(), ttl_ms, flags) }
    }

    pub fn ptimer_register(key: &[u8], ts: i64) {
        unsafe { host_ptimer_register(key.as_ptr(), key.len(), ts) }
    }

    pub fn ptimer_delete(key: &[u8], ts: i64) {
        unsafe { host_ptimer_delete(key.as_ptr(), key.len(), ts) }
    }

    pub fn processing_time() -> i64 {
        unsafe { host_processing_time() }
    }

    pub fn emit_watermark(ts: i64) {
        unsafe { host_emit_watermark(ts) }
    }

    pub fn input_watermark(input: i32) -> i64 {
        unsafe { host_input_watermark(input) }
    }

    pub fn emit_to(name: &[u8], frame: &[u8]) {
        unsafe { host_emit_to(name.as_ptr(), name.len(), frame.as_ptr(), frame.len()) }
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
    //! Natively every import goes to the simulated host of [`crate::testing`]
    //! (one per thread; a harness swaps its own in while it calls the operator).
    use crate::testing::sim::with;

    pub fn copy_out(v: &[u8], buf: *mut u8, cap: usize) -> i32 {
        if !v.is_empty() && v.len() <= cap {
            unsafe { core::ptr::copy_nonoverlapping(v.as_ptr(), buf, v.len()) };
        }
        v.len() as i32
    }
    fn out(v: Option<Vec<u8>>, buf: *mut u8, cap: usize) -> i32 {
        match v {
            Some(v) => copy_out(&v, buf, cap),
            None => -1,
        }
    }

    pub fn emit(frame: &[u8]) {
        with(|h| h.emit(frame))
    }
    pub fn state_get(name: &[u8], key: &[u8], buf: *mut u8, cap: usize) -> i32 {
        let v = with(|h| h.state_get(name, key));
        out(v, buf, cap)
    }
    pub fn state_put(name: &[u8], key: &[u8], value: &[u8]) {
        with(|h| h.state_put(name, key, value))
    }
    pub fn state_delete(name: &[u8], key: &[u8]) {
        with(|h| h.state_delete(name, key))
    }
    pub fn list_state_add(name: &[u8], mode: i32, value: &[u8]) {
        with(|h| h.list_state_add(name, mode, value))
    }
    pub fn list_state_get(name: &[u8], index: i32, buf: *mut u8, cap: usize) -> i32 {
        let v = with(|h| h.list_state_get(name, index));
        out(v, buf, cap)
    }
    pub fn timer_register(key: &[u8], ts: i64) {
        with(|h| h.timer_register(key, ts))
    }
    pub fn timer_delete(key: &[u8], ts: i64) {
        with(|h| h.timer_delete(key, ts))
    }
    pub fn current_watermark() -> i64 {
        with(|h| h.current_watermark())
    }
    pub fn log(level: i32, msg: &str) {
        with(|h| h.log(level, msg))
    }
    pub fn fail(msg: &str) -> ! {
        std::panic::panic_any(crate::testing::sim::Failed(msg.to_string()))
    }
    pub fn reject(msg: &str) {
        with(|h| h.reject(msg))
    }
    pub fn mstate_get(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8], buf: *mut u8, cap: usize) -> i32 {
        let v = with(|h| h.mstate_get(name, key, ns, ukey));
        out(v, buf, cap)
    }
    pub fn mstate_put(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8], value: &[u8]) {
        with(|h| h.mstate_put(name, key, ns, ukey, value))
    }
    pub fn mstate_append(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8], value: &[u8]) {
        with(|h| h.mstate_append(name, key, ns, ukey, value))
    }
    pub fn mstate_remove(name: &[u8], key: &[u8], ns: &[u8], ukey: &[u8]) {
        with(|h| h.mstate_remove(name, key, ns, ukey))
    }
    pub fn mstate_entries(name: &[u8], key: &[u8], ns: &[u8], buf: *mut u8, cap: usize) -> i32 {
        let v = with(|h| h.mstate_entries(name, key, ns));
        out(v, buf, cap)
    }
    pub fn mstate_clear(name: &[u8], key: &[u8], ns: &[u8]) {
        with(|h| h.mstate_clear(name, key, ns))
    }
    pub fn state_ttl(name: &[u8], ttl_ms: i64, flags: i32) {
        with(|h| h.state_ttl(name, ttl_ms, flags))
    }
    pub fn ptimer_register(key: &[u8], ts: i64) {
        with(|h| h.ptimer_register(key, ts))
    }
    pub fn ptimer_delete(key: &[u8], ts: i64) {
        with(|h| h.ptimer_delete(key, ts))
    }
    pub fn processing_time() -> i64 {
        with(|h| h.processing_time())
    }
    pub fn emit_watermark(ts: i64) {
        with(|h| h.emit_watermark(ts))
    }
    pub fn input_watermark(input: i32) -> i64 {
        with(|h| h.input_watermark(input))
    }
    pub fn emit_to(name: &[u8], frame: &[u8]) {
        with(|h| h.emit_to(name, frame))
    }
}

pub use imp::*;
