// Package nexmark reads the events of streamd's nexmark source
// (docs/nexmark.md) in place: Parse checks an encoded event's length once,
// and every field is then read at its offset without allocating.
//
// The encoding is little-endian with no padding:
//
//	byte 0        kind: KindPerson, KindAuction or KindBid
//	bytes 1..     the kind's int64 fields, 8 bytes each, in the order below
//	then          the u16 end offset of each string field, relative to the
//	              first string byte, in the order below
//	then          the string bytes, back to back
//
//	person:  id, date_time                                  | name, email_address, credit_card, city, state, extra
//	auction: id, initial_bid, reserve, date_time, expires,
//	         seller, category                               | item_name, description, extra
//	bid:     auction, bidder, price, date_time              | extra
//
// Times are ms since the Unix epoch, prices cents.
package nexmark

import (
	"encoding/binary"
	"fmt"
)

// Kinds of events (byte 0).
const (
	KindPerson  = 0
	KindAuction = 1
	KindBid     = 2
)

// Index of each int64 field (Event.Int) and string field (Event.Str) per kind.
const (
	PersonID, PersonDateTime = 0, 1

	PersonName, PersonEmail, PersonCreditCard, PersonCity, PersonState, PersonExtra = 0, 1, 2, 3, 4, 5

	AuctionID, AuctionInitialBid, AuctionReserve, AuctionDateTime, AuctionExpires, AuctionSeller, AuctionCategory = 0, 1, 2, 3, 4, 5, 6

	AuctionItemName, AuctionDescription, AuctionExtra = 0, 1, 2

	BidAuction, BidBidder, BidPrice, BidDateTime = 0, 1, 2, 3

	BidExtra = 0
)

// Shape is the number of int64 and of string fields of each kind.
var Shape = [3][2]int{{2, 6}, {7, 3}, {4, 1}}

// Event is an encoded event whose length Parse checked.
type Event []byte

// Parse checks that b is one complete event and returns it; it aliases b.
func Parse(b []byte) (Event, error) {
	if len(b) < 1 || b[0] > KindBid {
		return nil, fmt.Errorf("nexmark: not an event (kind byte %v)", b[:min(len(b), 1)])
	}
	ints, strs := Shape[b[0]][0], Shape[b[0]][1]
	head := 1 + 8*ints + 2*strs
	if len(b) < head {
		return nil, fmt.Errorf("nexmark: %d-byte event shorter than its %d-byte header", len(b), head)
	}
	last := 0
	for j := range strs {
		e := int(binary.LittleEndian.Uint16(b[1+8*ints+2*j:]))
		if e < last {
			return nil, fmt.Errorf("nexmark: string %d ends at %d, before the previous one (%d)", j, e, last)
		}
		last = e
	}
	if len(b) != head+last {
		return nil, fmt.Errorf("nexmark: %d-byte event, its fields need %d", len(b), head+last)
	}
	return Event(b), nil
}

// Kind is KindPerson, KindAuction or KindBid.
func (e Event) Kind() int { return int(e[0]) }

// Int is int64 field i of the event's kind.
func (e Event) Int(i int) int64 { return int64(binary.LittleEndian.Uint64(e[1+8*i:])) }

// Str is string field j of the event's kind; it aliases e.
func (e Event) Str(j int) []byte {
	base := 1 + 8*Shape[e[0]][0]
	area := base + 2*Shape[e[0]][1]
	s := 0
	if j > 0 {
		s = int(binary.LittleEndian.Uint16(e[base+2*(j-1):]))
	}
	return e[area+s : area+int(binary.LittleEndian.Uint16(e[base+2*j:]))]
}

// Person, Auction and Bid are typed views of an event of their kind.
type (
	Person  struct{ Event }
	Auction struct{ Event }
	Bid     struct{ Event }
)

// Person is the event as a person; ok is false for another kind.
func (e Event) Person() (p Person, ok bool) { return Person{e}, e.Kind() == KindPerson }

// Auction is the event as an auction; ok is false for another kind.
func (e Event) Auction() (a Auction, ok bool) { return Auction{e}, e.Kind() == KindAuction }

// Bid is the event as a bid; ok is false for another kind.
func (e Event) Bid() (b Bid, ok bool) { return Bid{e}, e.Kind() == KindBid }

func (p Person) ID() int64          { return p.Int(PersonID) }
func (p Person) DateTime() int64    { return p.Int(PersonDateTime) }
func (p Person) Name() []byte       { return p.Str(PersonName) }
func (p Person) Email() []byte      { return p.Str(PersonEmail) }
func (p Person) CreditCard() []byte { return p.Str(PersonCreditCard) }
func (p Person) City() []byte       { return p.Str(PersonCity) }
func (p Person) State() []byte      { return p.Str(PersonState) }
func (p Person) Extra() []byte      { return p.Str(PersonExtra) }

func (a Auction) ID() int64           { return a.Int(AuctionID) }
func (a Auction) InitialBid() int64   { return a.Int(AuctionInitialBid) }
func (a Auction) Reserve() int64      { return a.Int(AuctionReserve) }
func (a Auction) DateTime() int64     { return a.Int(AuctionDateTime) }
func (a Auction) Expires() int64      { return a.Int(AuctionExpires) }
func (a Auction) Seller() int64       { return a.Int(AuctionSeller) }
func (a Auction) Category() int64     { return a.Int(AuctionCategory) }
func (a Auction) ItemName() []byte    { return a.Str(AuctionItemName) }
func (a Auction) Description() []byte { return a.Str(AuctionDescription) }
func (a Auction) Extra() []byte       { return a.Str(AuctionExtra) }

func (b Bid) Auction() int64  { return b.Int(BidAuction) }
func (b Bid) Bidder() int64   { return b.Int(BidBidder) }
func (b Bid) Price() int64    { return b.Int(BidPrice) }
func (b Bid) DateTime() int64 { return b.Int(BidDateTime) }
func (b Bid) Extra() []byte   { return b.Str(BidExtra) }
