package nexmark

import (
	"encoding/binary"

	sdk "github.com/streamd/streamd/sdk/go/nexmark"
)

// The binary encoding of an event is the SDK's (sdk/go/nexmark, which
// documents the layout); this file writes it and decodes it into structs.

const (
	KindPerson  = sdk.KindPerson
	KindAuction = sdk.KindAuction
	KindBid     = sdk.KindBid
)

var shape = sdk.Shape

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
	v, err := sdk.Parse(b)
	if err != nil {
		return Event{}, err
	}
	s := func(j int) string { return string(v.Str(j)) }
	switch v.Kind() {
	case KindPerson:
		return Event{Person: &Person{ID: v.Int(sdk.PersonID), DateTime: v.Int(sdk.PersonDateTime), Name: s(sdk.PersonName), Email: s(sdk.PersonEmail),
			CreditCard: s(sdk.PersonCreditCard), City: s(sdk.PersonCity), State: s(sdk.PersonState), Extra: s(sdk.PersonExtra)}}, nil
	case KindAuction:
		return Event{Auction: &Auction{ID: v.Int(sdk.AuctionID), InitialBid: v.Int(sdk.AuctionInitialBid), Reserve: v.Int(sdk.AuctionReserve),
			DateTime: v.Int(sdk.AuctionDateTime), Expires: v.Int(sdk.AuctionExpires), Seller: v.Int(sdk.AuctionSeller), Category: v.Int(sdk.AuctionCategory),
			ItemName: s(sdk.AuctionItemName), Description: s(sdk.AuctionDescription), Extra: s(sdk.AuctionExtra)}}, nil
	}
	return Event{Bid: &Bid{Auction: v.Int(sdk.BidAuction), Bidder: v.Int(sdk.BidBidder), Price: v.Int(sdk.BidPrice), DateTime: v.Int(sdk.BidDateTime), Extra: s(sdk.BidExtra)}}, nil
}
