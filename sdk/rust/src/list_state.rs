//! Operator list state: the operator's own non-keyed state, written in
//! `snapshot_state` and read back after a restore (usually in `open`).

use crate::state::read_growing;
use crate::sys;

/// How entries are redistributed when the job is restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ListMode {
    /// The entries of all subtasks are divided among the new subtasks, round robin.
    Split = 0,
    /// Every new subtask gets the entries of every old subtask.
    Union = 1,
    /// Every subtask wrote the same entries; each new subtask gets one copy.
    Broadcast = 2,
}

/// Appends an entry to list state `name`. Only allowed in `snapshot_state`;
/// each snapshot starts from empty lists. One name must keep one mode.
pub fn add(name: &str, mode: ListMode, value: &[u8]) {
    sys::list_state_add(name.as_bytes(), mode as i32, value)
}

/// Entry `index` of the restored list state `name`, `None` past the end.
pub fn get(name: &str, index: u32) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    if read_growing(&mut v, |ptr, cap| sys::list_state_get(name.as_bytes(), index as i32, ptr, cap)) {
        Some(v)
    } else {
        None
    }
}

/// All restored entries of list state `name` (empty when there are none).
pub fn entries(name: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(v) = get(name, out.len() as u32) {
        out.push(v);
    }
    out
}
