//! The Nexmark queries with the Rust SDK (docs/nexmark.md). One module; the
//! job file picks the query and the stage by config (`query`, `stage`):
//!
//! | query | stages (job order)  | what it computes |
//! |-------|---------------------|------------------|
//! | q0    | `map`               | every bid, as is |
//! | q1    | `map`               | every bid, price in euros (x 0.908, cents rounded down) |
//! | q2    | `map`               | auction and price of the bids whose auction id is a multiple of 123 |
//! | q3    | `key`, `join`       | sellers in OR, ID or CA of category-10 auctions (incremental join, keyed state) |
//! | q4    | `key`, `close`, `avg` | average closing price per category, per 10 s of closing time |
//! | q5    | `key`, `count`, `max` | hot items: the most-bid auctions of each 10 s window sliding by 2 s |
//! | q7    | `key`, `max`, `top` | the highest bids of each 10 s tumbling window |
//! | q8    | `key`, `join`       | people who opened an auction in the 10 s window they registered in |
//!
//! `key` stages run forward from the source and give records the key the
//! next stage is partitioned by (hash). Outputs are CSV lines.

use streamd::nexmark::{Event, Kind};
use streamd::{timer, Batch, Bytes, Context, ListState, MapState, Operator, Record, Result, ValueState, ValueWriter, I64};

/// Window size of q4 (closing time), q5, q7 and q8 (nexmark's windowSizeSec).
pub const WINDOW_MS: i64 = 10_000;
/// Slide of q5's windows (nexmark-flink's q5: HOP of 2 s).
pub const SLIDE_MS: i64 = 2_000;

fn event<'a>(rec: &Record<'a>) -> Result<Event<'a>> {
    Event::parse(rec.value)
}

/// Appends `x` in decimal.
fn int(w: &mut ValueWriter<'_>, x: i64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let neg = x < 0;
    let mut u = x.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if neg {
        w.push(b'-');
    }
    w.write_bytes(&buf[i..]);
}

/// Appends the fields as one CSV line: integers and byte strings.
enum F<'a> {
    I(i64),
    S(&'a [u8]),
}

fn line(w: &mut ValueWriter<'_>, fields: &[F<'_>]) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            w.push(b',');
        }
        match f {
            F::I(x) => int(w, *x),
            F::S(s) => w.write_bytes(s),
        }
    }
}

fn le(x: i64) -> [u8; 8] {
    x.to_le_bytes()
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    i64::from_le_bytes(x)
}

fn window_start(ts: i64, size: i64) -> i64 {
    ts - ts.rem_euclid(size)
}

// ---- q0, q1, q2: stateless maps over the bids --------------------------------

/// A stateless stage: `f` handles each record of the batch.
struct Map(fn(&Record<'_>) -> Result<()>);

impl Operator for Map {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        (self.0)(rec)
    }
    fn process_batch(&mut self, batch: &Batch<'_>, _input: u32) -> Result<()> {
        for rec in batch {
            (self.0)(&rec)?;
        }
        Ok(())
    }
}

/// q0, pass through: auction, bidder, price, date_time, extra of every bid.
fn q0(rec: &Record<'_>) -> Result<()> {
    if let Some(b) = event(rec)?.bid() {
        streamd::emit_with(b"", rec.timestamp, |w| line(w, &[F::I(b.auction()), F::I(b.bidder()), F::I(b.price()), F::I(b.date_time()), F::S(b.extra())]));
    }
    Ok(())
}

/// Dollars to euros, as nexmark-flink's q1 (0.908 * price), in whole cents
/// rounded down.
pub fn euros(cents: i64) -> i64 {
    cents * 908 / 1000
}

/// q1, currency conversion.
fn q1(rec: &Record<'_>) -> Result<()> {
    if let Some(b) = event(rec)?.bid() {
        streamd::emit_with(b"", rec.timestamp, |w| line(w, &[F::I(b.auction()), F::I(b.bidder()), F::I(euros(b.price())), F::I(b.date_time()), F::S(b.extra())]));
    }
    Ok(())
}

/// q2, selection: auction and price of the bids on every 123rd auction.
fn q2(rec: &Record<'_>) -> Result<()> {
    if let Some(b) = event(rec)?.bid() {
        if b.auction() % 123 == 0 {
            streamd::emit_with(b"", rec.timestamp, |w| line(w, &[F::I(b.auction()), F::I(b.price())]));
        }
    }
    Ok(())
}

// ---- key stages -------------------------------------------------------------

/// What a key stage keeps: the key, and whether the value goes along.
type KeyFn = fn(Event<'_>) -> Option<(i64, bool)>;

/// A key stage: records `f` keeps, keyed by the i64 it returns (8 bytes LE).
struct Key(KeyFn);

impl Operator for Key {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        if let Some((k, keep)) = (self.0)(event(rec)?) {
            streamd::emit(&le(k), if keep { rec.value } else { b"" }, rec.timestamp);
        }
        Ok(())
    }
    fn process_batch(&mut self, batch: &Batch<'_>, input: u32) -> Result<()> {
        for rec in batch {
            self.process_element(&rec, input)?;
        }
        Ok(())
    }
}

/// q3: people of OR, ID and CA by id, category-10 auctions by seller.
fn q3_key(e: Event<'_>) -> Option<(i64, bool)> {
    match e.kind() {
        Kind::Person(p) if matches!(p.state(), b"OR" | b"ID" | b"CA") => Some((p.id(), true)),
        Kind::Auction(a) if a.category() == 10 => Some((a.seller(), true)),
        _ => None,
    }
}

/// q4: auctions by id, bids by auction.
fn q4_key(e: Event<'_>) -> Option<(i64, bool)> {
    match e.kind() {
        Kind::Auction(a) => Some((a.id(), true)),
        Kind::Bid(b) => Some((b.auction(), true)),
        _ => None,
    }
}

/// q5: bids by auction; the count needs only their time.
fn q5_key(e: Event<'_>) -> Option<(i64, bool)> {
    e.bid().map(|b| (b.auction(), false))
}

/// Shards of q7's first stage: bids spread by price.
pub const Q7_SHARDS: i64 = 64;

/// q7: bids spread over shards by price.
fn q7_key(e: Event<'_>) -> Option<(i64, bool)> {
    e.bid().map(|b| (b.price() % Q7_SHARDS, true))
}

/// q8: people by id, auctions by seller.
fn q8_key(e: Event<'_>) -> Option<(i64, bool)> {
    match e.kind() {
        Kind::Person(p) => Some((p.id(), true)),
        Kind::Auction(a) => Some((a.seller(), true)),
        _ => None,
    }
}

// ---- q3: incremental join of people and auctions ------------------------------

/// "name,city,state" of the seller once it arrived.
const Q3_PERSON: ValueState<Bytes> = ValueState::new("person");
/// Auction ids that arrived before their seller.
const Q3_PENDING: ListState<I64> = ListState::new("pending");

#[derive(Default)]
struct Q3Join {
    buf: Vec<u8>,
}

impl Operator for Q3Join {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        match event(rec)?.kind() {
            Kind::Person(p) => {
                self.buf.clear();
                for (i, s) in [p.name(), p.city(), p.state()].iter().enumerate() {
                    if i > 0 {
                        self.buf.push(b',');
                    }
                    self.buf.extend_from_slice(s);
                }
                Q3_PERSON.set_raw(&self.buf);
                for id in Q3_PENDING.get() {
                    q3_emit(&self.buf, id, rec.timestamp);
                }
                Q3_PENDING.clear();
            }
            Kind::Auction(a) => {
                if Q3_PERSON.get_raw(&mut self.buf) {
                    q3_emit(&self.buf, a.id(), rec.timestamp);
                } else {
                    Q3_PENDING.add(&a.id());
                }
            }
            Kind::Bid(_) => {}
        }
        Ok(())
    }
}

fn q3_emit(person: &[u8], auction: i64, ts: i64) {
    streamd::emit_with(b"", ts, |w| line(w, &[F::S(person), F::I(auction)]));
}

// ---- q4: closing price per auction, then the average per category ----------------

/// date_time, expires, category of the auction (3 x i64 LE).
const Q4_AUCTION: ValueState<Bytes> = ValueState::new("auction");
/// The highest price of the bids within the auction's lifetime.
const Q4_MAX: ValueState<I64> = ValueState::new("max");
/// Bids that arrived before their auction: date_time, price (2 x i64 LE).
const Q4_EARLY: ListState<Bytes> = ListState::new("early");

#[derive(Default)]
struct Q4Close {
    buf: Vec<u8>,
}

fn q4_bid(start: i64, expires: i64, dt: i64, price: i64) {
    if dt >= start && dt <= expires && Q4_MAX.get().map_or(true, |m| price > m) {
        Q4_MAX.set(&price);
    }
}

impl Operator for Q4Close {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        match event(rec)?.kind() {
            Kind::Auction(a) => {
                self.buf.clear();
                for x in [a.date_time(), a.expires(), a.category()] {
                    self.buf.extend_from_slice(&le(x));
                }
                Q4_AUCTION.set_raw(&self.buf);
                Q4_EARLY.for_each_raw(|b| q4_bid(a.date_time(), a.expires(), i64_at(b, 0), i64_at(b, 8)));
                Q4_EARLY.clear();
                timer::register_event_time(a.expires());
            }
            Kind::Bid(b) => {
                if Q4_AUCTION.get_raw(&mut self.buf) {
                    q4_bid(i64_at(&self.buf, 0), i64_at(&self.buf, 8), b.date_time(), b.price());
                } else {
                    // Before its auction (another source subtask), or after
                    // it closed: kept until the watermark passes it, when
                    // no auction that could count it can still come.
                    let mut v = [0u8; 16];
                    v[..8].copy_from_slice(&le(b.date_time()));
                    v[8..].copy_from_slice(&le(b.price()));
                    Q4_EARLY.add(&v.to_vec());
                    timer::register_event_time(b.date_time());
                }
            }
            Kind::Person(_) => {}
        }
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, _key: &[u8]) -> Result<()> {
        if Q4_AUCTION.get_raw(&mut self.buf) {
            if ts == i64_at(&self.buf, 8) {
                if let Some(price) = Q4_MAX.get() {
                    streamd::emit(&self.buf[16..24], &le(price), ts);
                }
                Q4_AUCTION.clear();
                Q4_MAX.clear();
            }
            return Ok(());
        }
        let mut keep = Vec::new();
        Q4_EARLY.for_each_raw(|b| {
            if i64_at(b, 0) > ts {
                keep.push(b.to_vec())
            }
        });
        Q4_EARLY.update(&keep);
        Ok(())
    }
}

/// Per category (the key): sum and count (2 x i64 LE) of the closing prices
/// of each 10 s window of closing time, by window start.
const Q4_SUMS: MapState<I64, Bytes> = MapState::new("sums");

struct Q4Avg;

impl Operator for Q4Avg {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let w = window_start(rec.timestamp, WINDOW_MS);
        let price = i64_at(rec.value, 0);
        let (sum, n) = Q4_SUMS.get(&w).map_or((0, 0), |b| (i64_at(&b, 0), i64_at(&b, 8)));
        let mut v = le(sum + price).to_vec();
        v.extend_from_slice(&le(n + 1));
        Q4_SUMS.put(&w, &v);
        timer::register_event_time(w + WINDOW_MS - 1);
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        let w = ts + 1 - WINDOW_MS;
        if let Some(b) = Q4_SUMS.get(&w) {
            let (sum, n) = (i64_at(&b, 0), i64_at(&b, 8));
            streamd::emit_with(b"", ts, |o| line(o, &[F::I(i64_at(key, 0)), F::I(w), F::I(w + WINDOW_MS), F::I(n), F::I(sum / n)]));
            Q4_SUMS.remove(&w);
        }
        Ok(())
    }
}

// ---- q5: hot items ----------------------------------------------------------

/// Per auction: bids per 2 s pane, by pane start.
const Q5_PANES: MapState<I64, I64> = MapState::new("panes");

struct Q5Count;

impl Operator for Q5Count {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let p = window_start(rec.timestamp, SLIDE_MS);
        let n = Q5_PANES.get(&p).unwrap_or(0);
        Q5_PANES.put(&p, &(n + 1));
        if n == 0 {
            // A new pane: a timer at the end of each window that holds it.
            // (Not chained from on_timer: a timer registered there at or
            // below the watermark would fire only at the next advance.)
            let mut end = p + SLIDE_MS;
            while end - WINDOW_MS <= p {
                timer::register_event_time(end - 1);
                end += SLIDE_MS;
            }
        }
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        let end = ts + 1;
        let mut count = 0i64;
        let mut old = Vec::new();
        Q5_PANES.for_each_raw(|k, v| {
            let p = i64_at(k, 0);
            if p >= end - WINDOW_MS && p < end {
                count += i64_at(v, 0);
            }
            if p < end + SLIDE_MS - WINDOW_MS {
                old.push(p); // in no later window
            }
        });
        if count > 0 {
            let mut v = [0u8; 16];
            v[..8].copy_from_slice(key);
            v[8..].copy_from_slice(&le(count));
            streamd::emit(&le(end), &v, ts);
        }
        for p in old {
            Q5_PANES.remove(&p);
        }
        Ok(())
    }
}

/// Per window end: the highest count and the auctions that have it.
const Q5_MAXN: ValueState<I64> = ValueState::new("maxn");
const Q5_TOP: ListState<I64> = ListState::new("top");

struct Q5Max;

impl Operator for Q5Max {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let (auction, n) = (i64_at(rec.value, 0), i64_at(rec.value, 8));
        match Q5_MAXN.get() {
            Some(m) if n < m => {}
            Some(m) if n == m => Q5_TOP.add(&auction),
            _ => {
                Q5_MAXN.set(&n);
                Q5_TOP.update(&[auction]);
            }
        }
        timer::register_event_time(rec.timestamp);
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        if let Some(n) = Q5_MAXN.get() {
            let end = i64_at(key, 0);
            for a in Q5_TOP.get() {
                streamd::emit_with(b"", ts, |w| line(w, &[F::I(a), F::I(n), F::I(end - WINDOW_MS), F::I(end)]));
            }
        }
        Q5_MAXN.clear();
        Q5_TOP.clear();
        Ok(())
    }
}

// ---- q7: highest bid --------------------------------------------------------

/// Merges candidates `price` + CSV lines (`lines`, '\n'-separated) into
/// `best` (i64 LE price, then the lines of the bids with that price).
fn merge_best(best: &mut Vec<u8>, have: bool, price: i64, lines: &[u8]) {
    if !have || price > i64_at(best, 0) {
        best.clear();
        best.extend_from_slice(&le(price));
        best.extend_from_slice(lines);
    } else if price == i64_at(best, 0) {
        best.push(b'\n');
        best.extend_from_slice(lines);
    }
}

/// Per shard: the best bids of each window, by window start.
const Q7_BEST: MapState<I64, Bytes> = MapState::new("best");

struct Q7Max;

impl Operator for Q7Max {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let b = match event(rec)?.bid() {
            Some(b) => b,
            None => return Ok(()),
        };
        let w = window_start(rec.timestamp, WINDOW_MS);
        let cur = Q7_BEST.get(&w);
        if let Some(c) = &cur {
            if b.price() < i64_at(c, 0) {
                return Ok(());
            }
        }
        let mut csv = Vec::new();
        q7_line(&mut csv, b);
        let have = cur.is_some();
        let mut best = cur.unwrap_or_default();
        merge_best(&mut best, have, b.price(), &csv);
        Q7_BEST.put(&w, &best);
        timer::register_event_time(w + WINDOW_MS - 1);
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, _key: &[u8]) -> Result<()> {
        let w = ts + 1 - WINDOW_MS;
        if let Some(best) = Q7_BEST.get(&w) {
            streamd::emit(&le(w + WINDOW_MS), &best, ts);
            Q7_BEST.remove(&w);
        }
        Ok(())
    }
}

/// q7's output line: auction, price, bidder, date_time, extra.
fn q7_line(out: &mut Vec<u8>, b: streamd::nexmark::Bid<'_>) {
    use std::io::Write;
    let _ = write!(out, "{},{},{},{},", b.auction(), b.price(), b.bidder(), b.date_time());
    out.extend_from_slice(b.extra());
}

/// Per window end: the best bids over all shards.
const Q7_TOP: ValueState<Bytes> = ValueState::new("top");

#[derive(Default)]
struct Q7Top {
    buf: Vec<u8>,
}

impl Operator for Q7Top {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let have = Q7_TOP.get_raw(&mut self.buf);
        merge_best(&mut self.buf, have, i64_at(rec.value, 0), &rec.value[8..]);
        Q7_TOP.set_raw(&self.buf);
        timer::register_event_time(rec.timestamp);
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, _key: &[u8]) -> Result<()> {
        if Q7_TOP.get_raw(&mut self.buf) {
            for l in self.buf[8..].split(|&c| c == b'\n') {
                streamd::emit(b"", l, ts);
            }
            Q7_TOP.clear();
        }
        Ok(())
    }
}

// ---- q8: new users who opened an auction ------------------------------------

/// The person (window start as i64 LE, then the name).
const Q8_PERSON: ValueState<Bytes> = ValueState::new("person");
/// Window starts in which the person (the key) opened an auction.
const Q8_AUCTIONS: MapState<I64, Bytes> = MapState::new("auctions");

#[derive(Default)]
struct Q8Join {
    buf: Vec<u8>,
}

impl Operator for Q8Join {
    fn process_element(&mut self, rec: &Record<'_>, _input: u32) -> Result<()> {
        let w = window_start(rec.timestamp, WINDOW_MS);
        match event(rec)?.kind() {
            Kind::Person(p) => {
                self.buf.clear();
                self.buf.extend_from_slice(&le(w));
                self.buf.extend_from_slice(p.name());
                Q8_PERSON.set_raw(&self.buf);
            }
            Kind::Auction(_) => Q8_AUCTIONS.put(&w, &Vec::new()),
            Kind::Bid(_) => return Ok(()),
        }
        timer::register_event_time(w + WINDOW_MS - 1);
        Ok(())
    }

    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        let w = ts + 1 - WINDOW_MS;
        let person = Q8_PERSON.get_raw(&mut self.buf) && i64_at(&self.buf, 0) == w;
        if person && Q8_AUCTIONS.contains(&w) {
            let name = &self.buf[8..];
            streamd::emit_with(b"", ts, |o| line(o, &[F::I(i64_at(key, 0)), F::S(name), F::I(w)]));
        }
        Q8_AUCTIONS.remove(&w);
        if person {
            Q8_PERSON.clear();
        }
        Ok(())
    }
}

// ---- the module ---------------------------------------------------------------

/// The operator of config `query` and `stage`.
pub fn stage(query: &str, stage: &str) -> Option<Box<dyn Operator>> {
    let op: Box<dyn Operator> = match (query, stage) {
        ("q0", "map") => Box::new(Map(q0)),
        ("q1", "map") => Box::new(Map(q1)),
        ("q2", "map") => Box::new(Map(q2)),
        ("q3", "key") => Box::new(Key(q3_key)),
        ("q3", "join") => Box::new(Q3Join::default()),
        ("q4", "key") => Box::new(Key(q4_key)),
        ("q4", "close") => Box::new(Q4Close::default()),
        ("q4", "avg") => Box::new(Q4Avg),
        ("q5", "key") => Box::new(Key(q5_key)),
        ("q5", "count") => Box::new(Q5Count),
        ("q5", "max") => Box::new(Q5Max),
        ("q7", "key") => Box::new(Key(q7_key)),
        ("q7", "max") => Box::new(Q7Max),
        ("q7", "top") => Box::new(Q7Top::default()),
        ("q8", "key") => Box::new(Key(q8_key)),
        ("q8", "join") => Box::new(Q8Join::default()),
        _ => return None,
    };
    Some(op)
}

/// The module's operator: the stage named by config, built in open.
#[derive(Default)]
pub struct Nexmark(Option<Box<dyn Operator>>);

impl Nexmark {
    fn op(&mut self) -> &mut dyn Operator {
        self.0.as_deref_mut().expect("opened")
    }
}

impl Operator for Nexmark {
    fn open(&mut self, ctx: &Context) -> Result<()> {
        let (q, s) = (ctx.config_or("query", ""), ctx.config_or("stage", ""));
        let op = stage(q, s).ok_or_else(|| {
            streamd::Error::new(format!(
                "nexmark, operator {:?}: no stage {:?} of query {:?} (config query: q0, q1, q2, q3, q4, q5, q7 or q8; stage: see the module's doc)",
                ctx.operator, s, q
            ))
        })?;
        self.0.insert(op).open(ctx)
    }
    fn process_element(&mut self, rec: &Record<'_>, input: u32) -> Result<()> {
        self.op().process_element(rec, input)
    }
    fn process_batch(&mut self, batch: &Batch<'_>, input: u32) -> Result<()> {
        self.op().process_batch(batch, input)
    }
    fn on_timer(&mut self, ts: i64, key: &[u8]) -> Result<()> {
        self.op().on_timer(ts, key)
    }
}

streamd::export_operator!(Nexmark, Nexmark::default());
