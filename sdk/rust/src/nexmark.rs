//! Reads the events of streamd's nexmark source in place (docs/nexmark.md):
//! [`Event::parse`] checks an encoded event's length once, and every field
//! is then read at its offset, without allocating.
//!
//! The encoding is little-endian with no padding: byte 0 is the kind
//! ([`PERSON`], [`AUCTION`] or [`BID`]); then the kind's i64 fields, 8 bytes
//! each; then a u16 end offset per string field (relative to the first
//! string byte); then the string bytes back to back.
//!
//! ```text
//! person:  id, date_time                                  | name, email_address, credit_card, city, state, extra
//! auction: id, initial_bid, reserve, date_time, expires,
//!          seller, category                               | item_name, description, extra
//! bid:     auction, bidder, price, date_time              | extra
//! ```
//!
//! Times are ms since the Unix epoch, prices cents.

use crate::Error;

/// Kind byte of a person.
pub const PERSON: u8 = 0;
/// Kind byte of an auction.
pub const AUCTION: u8 = 1;
/// Kind byte of a bid.
pub const BID: u8 = 2;

/// (i64 fields, string fields) of each kind.
const SHAPE: [(usize, usize); 3] = [(2, 6), (7, 3), (4, 1)];

/// An encoded event whose length was checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event<'a>(&'a [u8]);

/// A person: `id`, `date_time`; `name`, `email`, `credit_card`, `city`, `state`, `extra`.
#[derive(Clone, Copy, Debug)]
pub struct Person<'a>(Event<'a>);
/// An auction: `id`, `initial_bid`, `reserve`, `date_time`, `expires`, `seller`, `category`; `item_name`, `description`, `extra`.
#[derive(Clone, Copy, Debug)]
pub struct Auction<'a>(Event<'a>);
/// A bid: `auction`, `bidder`, `price`, `date_time`; `extra`.
#[derive(Clone, Copy, Debug)]
pub struct Bid<'a>(Event<'a>);

/// An event by kind.
#[derive(Clone, Copy, Debug)]
pub enum Kind<'a> {
    /// A new person.
    Person(Person<'a>),
    /// A new auction.
    Auction(Auction<'a>),
    /// A bid.
    Bid(Bid<'a>),
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes([b[at], b[at + 1]]) as usize
}

impl<'a> Event<'a> {
    /// Checks that `b` is one complete event.
    pub fn parse(b: &'a [u8]) -> Result<Event<'a>, Error> {
        let kind = *b.first().ok_or_else(|| Error::new("nexmark: empty event"))?;
        let (ints, strs) = *SHAPE.get(kind as usize).ok_or_else(|| Error::new(format!("nexmark: unknown event kind {}", kind)))?;
        let head = 1 + 8 * ints + 2 * strs;
        if b.len() < head {
            return Err(Error::new(format!("nexmark: {}-byte event shorter than its {}-byte header", b.len(), head)));
        }
        let mut last = 0;
        for j in 0..strs {
            let e = u16_at(b, 1 + 8 * ints + 2 * j);
            if e < last {
                return Err(Error::new(format!("nexmark: string {} ends at {}, before the previous one ({})", j, e, last)));
            }
            last = e;
        }
        if b.len() != head + last {
            return Err(Error::new(format!("nexmark: {}-byte event, its fields need {}", b.len(), head + last)));
        }
        Ok(Event(b))
    }

    /// The kind byte.
    #[inline]
    pub fn kind_byte(&self) -> u8 {
        self.0[0]
    }

    /// The event by kind.
    #[inline]
    pub fn kind(self) -> Kind<'a> {
        match self.0[0] {
            PERSON => Kind::Person(Person(self)),
            AUCTION => Kind::Auction(Auction(self)),
            _ => Kind::Bid(Bid(self)),
        }
    }

    /// The event as a bid, if it is one.
    #[inline]
    pub fn bid(self) -> Option<Bid<'a>> {
        if self.0[0] == BID {
            Some(Bid(self))
        } else {
            None
        }
    }

    /// i64 field `i` of the event's kind.
    #[inline]
    pub fn int(&self, i: usize) -> i64 {
        let at = 1 + 8 * i;
        let mut x = [0u8; 8];
        x.copy_from_slice(&self.0[at..at + 8]);
        i64::from_le_bytes(x)
    }

    /// String field `j` of the event's kind.
    #[inline]
    pub fn str(&self, j: usize) -> &'a [u8] {
        let (ints, strs) = SHAPE[self.0[0] as usize];
        let base = 1 + 8 * ints;
        let area = base + 2 * strs;
        let s = if j > 0 { u16_at(self.0, base + 2 * (j - 1)) } else { 0 };
        &self.0[area + s..area + u16_at(self.0, base + 2 * j)]
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.0
    }
}

macro_rules! fields {
    ($t:ident { $($i:ident = $n:expr),* ; $($s:ident = $m:expr),* }) => {
        impl<'a> $t<'a> {
            $(#[doc = concat!("The `", stringify!($i), "` field.")] #[inline] pub fn $i(&self) -> i64 { self.0.int($n) })*
            $(#[doc = concat!("The `", stringify!($s), "` field.")] #[inline] pub fn $s(&self) -> &'a [u8] { self.0.str($m) })*
            /// The whole event.
            pub fn event(&self) -> Event<'a> { self.0 }
        }
    };
}

fields!(Person { id = 0, date_time = 1; name = 0, email = 1, credit_card = 2, city = 3, state = 4, extra = 5 });
fields!(Auction { id = 0, initial_bid = 1, reserve = 2, date_time = 3, expires = 4, seller = 5, category = 6; item_name = 0, description = 1, extra = 2 });
fields!(Bid { auction = 0, bidder = 1, price = 2, date_time = 3; extra = 0 });

#[cfg(test)]
mod tests {
    use super::*;

    fn bid() -> Vec<u8> {
        let mut b = vec![BID];
        for x in [1001i64, 2002, 12345, 1436918400000] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        b.extend_from_slice(&3u16.to_le_bytes());
        b.extend_from_slice(b"xyz");
        b
    }

    #[test]
    fn reads_a_bid() {
        let b = bid();
        let e = Event::parse(&b).unwrap();
        let x = e.bid().expect("a bid");
        assert_eq!((x.auction(), x.bidder(), x.price(), x.date_time(), x.extra()), (1001, 2002, 12345, 1436918400000, &b"xyz"[..]));
    }

    #[test]
    fn rejects_bad_events() {
        let b = bid();
        for bad in [&b[..0], &b[..10], &b[..b.len() - 1], &[7u8][..]] {
            assert!(Event::parse(bad).is_err(), "{:?} accepted", bad);
        }
    }
}
