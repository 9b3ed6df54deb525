//! Top N items per category in sliding event-time windows, with the Rust
//! SDK's window library. One module, two roles (config `role`):
//!
//! - `key`: parses each JSON line `{"ts": 1000, "category": "fruit", "item": "apple"}`
//!   (the file source already took the event time from `ts`) and emits
//!   key = category, value = item: a hash edge then sends each category to
//!   one `topn` subtask. A typed helper (`process_typed::<Str>`).
//! - `topn`: sliding windows of `size_ms` (default 10 s) every `slide_ms`
//!   (default 5 s) per category; an aggregate counts items incrementally
//!   (state: one item -> count map per window) and, when the watermark passes
//!   the window's end, a process function emits the top `n` (default 3) as
//!   `{"category":"fruit","start":0,"end":10000,"top":[["apple",3],["fig",1]]}`
//!   (count descending, then item). Late records go to side output `late`.

use std::collections::BTreeMap;
use std::fmt::Write;
use streamd::window::{AggregateProcessFn, TimeWindow, WindowOutput};
use streamd::{Aggregator, Batch, Codec, Context, Error, Operator, Record, Result, Str, WindowAssigner, WindowOperator, Windows};

/// The value of string or number field `name` of a flat JSON object (no
/// nesting; enough for this example's lines). Escapes other than `\"` and
/// `\\` are kept as written.
pub fn json_field<'a>(line: &'a str, name: &str) -> Option<std::borrow::Cow<'a, str>> {
    let pat = format!("\"{}\"", name);
    let mut rest = line;
    while let Some(i) = rest.find(&pat) {
        let after = rest[i + pat.len()..].trim_start();
        rest = &rest[i + pat.len()..];
        let v = match after.strip_prefix(':') {
            Some(v) => v.trim_start(),
            None => continue,
        };
        if let Some(s) = v.strip_prefix('"') {
            let mut out = String::new();
            let mut esc = false;
            for (j, c) in s.char_indices() {
                match (esc, c) {
                    (true, c) => {
                        out.push(c);
                        esc = false
                    }
                    (false, '\\') => esc = true,
                    (false, '"') => {
                        return Some(if out.len() == j { std::borrow::Cow::Borrowed(&s[..j]) } else { std::borrow::Cow::Owned(out) })
                    }
                    (false, c) => out.push(c),
                }
            }
            return None;
        }
        let end = v.find(|c: char| c == ',' || c == '}' || c.is_whitespace()).unwrap_or(v.len());
        return Some(std::borrow::Cow::Borrowed(&v[..end]));
    }
    None
}

/// Role `key`: category as key, item as value, timestamp unchanged.
pub fn key_by_category() -> impl Operator {
    streamd::process_typed::<Str, _>(|line: String, rec: &Record<'_>| {
        let field = |name: &str| json_field(&line, name).ok_or_else(|| streamd::reject(format!("line {:?} has no field {:?}", line, name)));
        let (category, item) = (field("category")?, field("item")?);
        streamd::emit(category.as_bytes(), item.as_bytes(), rec.timestamp);
        Ok(())
    })
}

/// The accumulator: count per item, encoded as `u32 n; n x (u32 len, item, i64 count)`.
pub struct Counts;

impl Codec for Counts {
    type Item = BTreeMap<String, i64>;
    fn encode(v: &Self::Item, out: &mut Vec<u8>) {
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        for (item, n) in v {
            out.extend_from_slice(&(item.len() as u32).to_le_bytes());
            out.extend_from_slice(item.as_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
    }
    fn decode(b: &[u8]) -> Result<Self::Item> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
            if b.len() < n {
                return Err(Error::new("truncated item counts"));
            }
            let (h, t) = b.split_at(n);
            *b = t;
            Ok(h)
        }
        let mut b = b;
        let u32_of = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
        let n = u32_of(take(&mut b, 4)?);
        let mut m = BTreeMap::new();
        for _ in 0..n {
            let len = u32_of(take(&mut b, 4)?);
            let item = String::from_utf8(take(&mut b, len)?.to_vec()).map_err(|e| Error::new(e.to_string()))?;
            let mut c = [0u8; 8];
            c.copy_from_slice(take(&mut b, 8)?);
            m.insert(item, i64::from_le_bytes(c));
        }
        Ok(m)
    }
}

/// Counts items; the result is the top `n`.
pub struct TopItems {
    /// How many items to keep.
    pub n: usize,
}

impl Aggregator for TopItems {
    type In = String;
    type Acc = BTreeMap<String, i64>;
    type Out = Vec<(String, i64)>;
    fn create_accumulator(&self) -> Self::Acc {
        BTreeMap::new()
    }
    fn add(&self, item: String, mut acc: Self::Acc) -> Self::Acc {
        *acc.entry(item).or_insert(0) += 1;
        acc
    }
    fn get_result(&self, acc: &Self::Acc) -> Self::Out {
        let mut v: Vec<(String, i64)> = acc.iter().map(|(k, n)| (k.clone(), *n)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(self.n);
        v
    }
    fn merge(&self, mut a: Self::Acc, b: Self::Acc) -> Self::Acc {
        for (k, n) in b {
            *a.entry(k).or_insert(0) += n;
        }
        a
    }
}

/// The process function: one JSON line per (category, window).
pub type Render = fn(&[u8], TimeWindow, Vec<(String, i64)>, &mut WindowOutput<'_>) -> Result<()>;

fn render(category: &[u8], w: TimeWindow, top: Vec<(String, i64)>, out: &mut WindowOutput<'_>) -> Result<()> {
    let mut s = String::new();
    write!(s, "{{\"category\":\"{}\",\"start\":{},\"end\":{},\"top\":[", String::from_utf8_lossy(category), w.start, w.end)?;
    for (i, (item, n)) in top.iter().enumerate() {
        write!(s, "{}[\"{}\",{}]", if i > 0 { "," } else { "" }, item, n)?;
    }
    s.push_str("]}");
    out.emit(s.as_bytes());
    Ok(())
}

/// Role `topn`: the window operator.
pub type TopN = WindowOperator<AggregateProcessFn<Str, Counts, TopItems, Render>>;

/// The `topn` window operator: sliding `size_ms` every `slide_ms`, top `n`.
pub fn top_n(size_ms: i64, slide_ms: i64, n: usize) -> TopN {
    Windows::<Str>::new(WindowAssigner::sliding_event_time(size_ms, slide_ms))
        .late_output("late")
        .aggregate_process::<Counts, _, _>(TopItems { n }, render as Render)
}

/// The module's operator: the role named by config `role`, built in open.
#[derive(Default)]
pub struct Example(Option<Box<dyn Operator>>);

impl Example {
    fn op(&mut self) -> &mut dyn Operator {
        self.0.as_deref_mut().expect("opened")
    }
}

impl Operator for Example {
    fn open(&mut self, ctx: &Context) -> Result<()> {
        let op: Box<dyn Operator> = match ctx.config("role") {
            Some("key") => Box::new(key_by_category()),
            Some("topn") => Box::new(top_n(
                ctx.config_u64_or("size_ms", 10_000)? as i64,
                ctx.config_u64_or("slide_ms", 5_000)? as i64,
                ctx.config_u64_or("n", 3)? as usize,
            )),
            other => return Err(format!("topn example, operator {:?}: config role must be \"key\" or \"topn\", not {:?}", ctx.operator, other).into()),
        };
        self.0.insert(op).open(ctx)
    }
    fn process_element(&mut self, rec: &Record<'_>, input: u32) -> Result<()> {
        self.op().process_element(rec, input)
    }
    fn process_batch(&mut self, batch: &Batch<'_>, input: u32) -> Result<()> {
        self.op().process_batch(batch, input)
    }
    fn on_watermark(&mut self, ts: i64) -> Result<()> {
        self.op().on_watermark(ts)
    }
    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        self.op().on_timer(ts, key)
    }
    fn on_processing_time(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        self.op().on_processing_time(ts, key)
    }
    fn end_input(&mut self, input: u32) -> Result<()> {
        self.op().end_input(input)
    }
    fn finish(&mut self) -> Result<()> {
        self.op().finish()
    }
}

streamd::export_operator!(Example, Example::default());

#[cfg(test)]
mod tests;
