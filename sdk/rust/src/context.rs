//! The open context: who this subtask is and the operator's config.

use crate::frame::{FrameError, Reader};
use crate::Error;

/// What the host tells a subtask in `open` (abi/ABI.md, "Open context").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Context {
    /// 0-based index of this subtask.
    pub subtask: u32,
    /// Number of subtasks of this operator.
    pub parallelism: u32,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// 0 on the first run, +1 on every restart of the job.
    pub attempt: u32,
    /// Number of inputs (edges) of this operator.
    pub num_inputs: u32,
    /// Whether state was restored from a checkpoint or savepoint; read your
    /// operator list state back with [`crate::list_state::entries`] then.
    pub restored: bool,
    /// The job's name.
    pub job: String,
    /// The operator's uid.
    pub operator: String,
    /// The operator's `config` map from the job file, every value as text, in
    /// the order the host sent it.
    pub config: Vec<(String, String)>,
}

const FLAG_RESTORED: u32 = 1;

impl Context {
    /// Decodes an open-context frame.
    pub fn decode(data: &[u8]) -> Result<Context, FrameError> {
        let mut r = Reader { b: data, off: 0 };
        let version = r.u32("abi_version")?;
        if version != 1 {
            return Err(FrameError::Version { got: version });
        }
        let mut c = Context {
            subtask: r.u32("subtask")?,
            parallelism: r.u32("parallelism")?,
            max_parallelism: r.u32("max_parallelism")?,
            attempt: r.u32("attempt")?,
            num_inputs: r.u32("num_inputs")?,
            ..Context::default()
        };
        c.restored = r.u32("flags")? & FLAG_RESTORED != 0;
        c.job = r.string("job")?;
        c.operator = r.string("operator")?;
        let n = r.u32("config_count")?;
        if (n as u64) * 8 > (data.len() - r.off) as u64 {
            return Err(FrameError::LengthOutOfBounds { at: r.off, what: "config entries", len: n });
        }
        c.config.reserve(n as usize);
        for _ in 0..n {
            let k = r.string("config key")?;
            let v = r.string("config value")?;
            c.config.push((k, v));
        }
        if r.off != data.len() {
            return Err(FrameError::Trailing { bytes: data.len() - r.off });
        }
        Ok(c)
    }

    /// Encodes the context as the host would; for tests and tools.
    pub fn encode(&self) -> Vec<u8> {
        fn put_str(d: &mut Vec<u8>, s: &str) {
            d.extend_from_slice(&(s.len() as u32).to_le_bytes());
            d.extend_from_slice(s.as_bytes());
        }
        let mut d = Vec::new();
        let flags = if self.restored { FLAG_RESTORED } else { 0 };
        for v in [1, self.subtask, self.parallelism, self.max_parallelism, self.attempt, self.num_inputs, flags] {
            d.extend_from_slice(&v.to_le_bytes());
        }
        put_str(&mut d, &self.job);
        put_str(&mut d, &self.operator);
        d.extend_from_slice(&(self.config.len() as u32).to_le_bytes());
        for (k, v) in &self.config {
            put_str(&mut d, k);
            put_str(&mut d, v);
        }
        d
    }

    /// The config value of `key`, if the job file sets it.
    pub fn config(&self, key: &str) -> Option<&str> {
        self.config.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The config value of `key`, or `default`.
    pub fn config_or<'a>(&'a self, key: &str, default: &'a str) -> &'a str {
        self.config(key).unwrap_or(default)
    }

    /// The config value of `key` as an unsigned integer; an error names the
    /// key and the value when it is not one.
    pub fn config_u64(&self, key: &str) -> Result<Option<u64>, Error> {
        match self.config(key) {
            None => Ok(None),
            Some(v) => v.trim().parse::<u64>().map(Some).map_err(|e| {
                Error::new(format!("config {:?} of operator {:?}: {:?} is not an unsigned integer: {}", key, self.operator, v, e))
            }),
        }
    }

    /// [`Context::config_u64`], or `default` when the key is absent.
    pub fn config_u64_or(&self, key: &str, default: u64) -> Result<u64, Error> {
        Ok(self.config_u64(key)?.unwrap_or(default))
    }

    /// The config value of `key` as a boolean: `true`/`false` (YAML's
    /// spelling), also `yes`/`no`, `on`/`off`, `1`/`0`, in any case.
    pub fn config_bool(&self, key: &str) -> Result<Option<bool>, Error> {
        match self.config(key) {
            None => Ok(None),
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "1" => Ok(Some(true)),
                "false" | "no" | "off" | "0" => Ok(Some(false)),
                _ => Err(Error::new(format!("config {:?} of operator {:?}: {:?} is not a boolean", key, self.operator, v))),
            },
        }
    }

    /// [`Context::config_bool`], or `default` when the key is absent.
    pub fn config_bool_or(&self, key: &str, default: bool) -> Result<bool, Error> {
        Ok(self.config_bool(key)?.unwrap_or(default))
    }
}
