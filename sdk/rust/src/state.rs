//! Keyed state: a map `(name, key) -> value` held and checkpointed by the host.
//!
//! Pass the key of the record (or timer) being processed: hash partitioning
//! sends a subtask only keys of its own key groups, and a state call with a key
//! outside them, or an empty key, fails the subtask.

use crate::{sys, Error};

/// One named keyed state: `ValueState::new("count")`, usable as a `const`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueState {
    name: &'static str,
}

impl ValueState {
    /// The state called `name`.
    pub const fn new(name: &'static str) -> ValueState {
        ValueState { name }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The value of `key`, or `None` when it has none.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        if self.get_into(key, &mut v) {
            Some(v)
        } else {
            None
        }
    }

    /// Reads the value of `key` into `buf` (replacing its contents) and returns
    /// true, or returns false when it has none. Reusing `buf` avoids an
    /// allocation per call.
    pub fn get_into(&self, key: &[u8], buf: &mut Vec<u8>) -> bool {
        buf.clear();
        read_growing(buf, |ptr, cap| sys::state_get(self.name.as_bytes(), key, ptr, cap))
    }

    /// Sets the value of `key`.
    pub fn put(&self, key: &[u8], value: &[u8]) {
        sys::state_put(self.name.as_bytes(), key, value)
    }

    /// Deletes the value of `key`, if any.
    pub fn delete(&self, key: &[u8]) {
        sys::state_delete(self.name.as_bytes(), key)
    }

    /// The value of `key` as a little-endian u64, `None` when it has none,
    /// and an error when the stored value is not 8 bytes.
    pub fn get_u64(&self, key: &[u8]) -> Result<Option<u64>, Error> {
        let mut b = [0u8; 8];
        let n = sys::state_get(self.name.as_bytes(), key, b.as_mut_ptr(), 8);
        match n {
            -1 => Ok(None),
            8 => Ok(Some(u64::from_le_bytes(b))),
            n => Err(Error::new(format!(
                "state {:?} of key {:?} holds {} bytes, not a little-endian u64",
                self.name,
                String::from_utf8_lossy(key),
                n
            ))),
        }
    }

    /// Stores `v` as a little-endian u64.
    pub fn put_u64(&self, key: &[u8], v: u64) {
        self.put(key, &v.to_le_bytes())
    }
}

/// Calls a host getter with `buf`'s spare capacity, growing it once when the
/// value is larger; returns false when the host has no value.
pub(crate) fn read_growing(buf: &mut Vec<u8>, mut get: impl FnMut(*mut u8, usize) -> i32) -> bool {
    loop {
        let n = get(buf.as_mut_ptr(), buf.capacity());
        if n < 0 {
            return false;
        }
        let n = n as usize;
        if n <= buf.capacity() {
            // The host wrote n bytes into the spare capacity.
            unsafe { buf.set_len(n) };
            return true;
        }
        buf.reserve_exact(n);
    }
}
