package nexmark

import (
	"encoding/binary"
	"fmt"
)

// The binary encoding of an event (docs/nexmark.md, "Encoding"), the
// value of each record of a nexmark source. Little-endian, no padding:
//
//	byte 0        kind: KindPerson, KindAuction or KindBid
//	bytes 1..     the kind's int64 fields, 8 bytes each, in the order below
//	then          u16 end offset of each string field, relative to the first
//	              string byte, in the order below
//	then          the string bytes (UTF-8, here ASCII), back to back
//
//	person:  id, date_time                                  | name, email_address, credit_card, city, state, extra
//	auction: id, initial_bid, reserve, date_time, expires,
//	         seller, category                               | item_name, description, extra
//	bid:     auction, bidder, price, date_time              | extra
//
// A field is at a fixed offset and string j spans ends[j-1]..ends[j], so a
// reader checks the length once and then reads any field without allocating.
const (
	KindPerson  = 0
	KindAuction = 1
	KindBid     = 2

	PersonInts, PersonStrings   = 2, 6
	AuctionInts, AuctionStrings = 7, 3
	BidInts, BidStrings         = 4, 1
)

// Field indexes of the int64 fields and the strings, per kind.
const (
	PersonID, PersonDateTime = 0, 1

	PersonName, PersonEmail, PersonCreditCard, PersonCity, PersonState, PersonExtra = 0, 1, 2, 3, 4, 5

	AuctionID, AuctionInitialBid, AuctionReserve, AuctionDateTime, AuctionExpires, AuctionSeller, AuctionCategory = 0, 1, 2, 3, 4, 5, 6

	AuctionItemName, AuctionDescription, AuctionExtra = 0, 1, 2

	BidAuction, BidBidder, BidPrice, BidDateTime = 0, 1, 2, 3

	BidExtra = 0
)

// shape is the number of int64 and string fields of each kind.
var shape = [3][2]int{{PersonInts, PersonStrings}, {AuctionInts, AuctionStrings}, {BidInts, BidStrings}}

// View reads an encoded event in place.
type View []byte

// Parse checks that b is a complete event and returns it as a View.
func Parse(b []byte) (View, error) {
	if len(b) < 1 || b[0] > KindBid {
		return nil, fmt.Errorf("nexmark: not an event (kind byte %v)", b[:min(len(b), 1)])
	}
	ints, strs := shape[b[0]][0], shape[b[0]][1]
	head := 1 + 8*ints + 2*strs
	if len(b) < head {
		return nil, fmt.Errorf("nexmark: %d-byte event shorter than its %d-byte header", len(b), head)
	}
	last := 0
	for j := range strs {
		e := int(binary.LittleEndian.Uint16(b[1+8*ints+2*j:]))
		if e < last {
			return nil, fmt.Errorf("nexmark: string %d ends at %d before the previous one (%d)", j, e, last)
		}
		last = e
	}
	if len(b) != head+last {
		return nil, fmt.Errorf("nexmark: %d-byte event, its fields need %d", len(b), head+last)
	}
	return View(b), nil
}

// Kind is KindPerson, KindAuction or KindBid.
func (v View) Kind() int { return int(v[0]) }

// Int is int64 field i of the event's kind.
func (v View) Int(i int) int64 { return int64(binary.LittleEndian.Uint64(v[1+8*i:])) }

// Str is string field j of the event's kind, aliasing v.
func (v View) Str(j int) []byte {
	base := 1 + 8*shape[v[0]][0]
	area := base + 2*shape[v[0]][1]
	s := 0
	if j > 0 {
		s = int(binary.LittleEndian.Uint16(v[base+2*(j-1):]))
	}
	e := int(binary.LittleEndian.Uint16(v[base+2*j:]))
	return v[area+s : area+e]
}

// encoder appends one event: begin writes the kind and reserves the fixed
// part, str appends a string, end fills in the string ends.
type encoder struct {
	start, ints, strs, nstr int
	dst                     []byte
}

func (e *encoder) begin(dst []byte, kind int) {
	e.dst, e.start = dst, len(dst)
	e.ints, e.strs = shape[kind][0], shape[kind][1]
	e.nstr = 0
	e.dst = append(e.dst, byte(kind))
	e.dst = append(e.dst, make([]byte, 8*e.ints+2*e.strs)...)
}

func (e *encoder) setInt(i int, x int64) {
	binary.LittleEndian.PutUint64(e.dst[e.start+1+8*i:], uint64(x))
}

func (e *encoder) area() int { return e.start + 1 + 8*e.ints + 2*e.strs }

// endStr records that string nstr ends at the current end of dst.
func (e *encoder) endStr() {
	binary.LittleEndian.PutUint16(e.dst[e.start+1+8*e.ints+2*e.nstr:], uint16(len(e.dst)-e.area()))
	e.nstr++
}

func (e *encoder) str(s string) {
	e.dst = append(e.dst, s...)
	e.endStr()
}

// Person, Auction and Bid are decoded events (the reference's model).
type Person struct {
	ID                                          int64
	Name, Email, CreditCard, City, State, Extra string
	DateTime                                    int64
}

type Auction struct {
	ID                           int64
	ItemName, Description, Extra string
	InitialBid, Reserve          int64
	DateTime, Expires            int64
	Seller, Category             int64
}

type Bid struct {
	Auction, Bidder, Price, DateTime int64
	Extra                            string
}

// Event is one decoded event: exactly one of its fields is set.
type Event struct {
	Person  *Person
	Auction *Auction
	Bid     *Bid
}

// Decode parses and copies an encoded event.
func Decode(b []byte) (Event, error) {
	v, err := Parse(b)
	if err != nil {
		return Event{}, err
	}
	s := func(j int) string { return string(v.Str(j)) }
	switch v.Kind() {
	case KindPerson:
		return Event{Person: &Person{ID: v.Int(PersonID), DateTime: v.Int(PersonDateTime), Name: s(PersonName), Email: s(PersonEmail),
			CreditCard: s(PersonCreditCard), City: s(PersonCity), State: s(PersonState), Extra: s(PersonExtra)}}, nil
	case KindAuction:
		return Event{Auction: &Auction{ID: v.Int(AuctionID), InitialBid: v.Int(AuctionInitialBid), Reserve: v.Int(AuctionReserve),
			DateTime: v.Int(AuctionDateTime), Expires: v.Int(AuctionExpires), Seller: v.Int(AuctionSeller), Category: v.Int(AuctionCategory),
			ItemName: s(AuctionItemName), Description: s(AuctionDescription), Extra: s(AuctionExtra)}}, nil
	}
	return Event{Bid: &Bid{Auction: v.Int(BidAuction), Bidder: v.Int(BidBidder), Price: v.Int(BidPrice), DateTime: v.Int(BidDateTime), Extra: s(BidExtra)}}, nil
}
