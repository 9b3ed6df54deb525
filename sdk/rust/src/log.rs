//! Writing lines to the host log (labelled with job, operator and subtask).

use crate::sys;

/// A log level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(i32)]
pub enum Level {
    /// Debug.
    Debug = 0,
    /// Info.
    Info = 1,
    /// Warn.
    Warn = 2,
    /// Error.
    Error = 3,
}

/// Writes `msg` at `level`.
pub fn log(level: Level, msg: &str) {
    sys::log(level as i32, msg)
}

/// Writes `msg` at debug level.
pub fn debug(msg: &str) {
    log(Level::Debug, msg)
}

/// Writes `msg` at info level.
pub fn info(msg: &str) {
    log(Level::Info, msg)
}

/// Writes `msg` at warn level.
pub fn warn(msg: &str) {
    log(Level::Warn, msg)
}

/// Writes `msg` at error level.
pub fn error(msg: &str) {
    log(Level::Error, msg)
}
