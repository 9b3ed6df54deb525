// Command nexmark_go is the stateless Nexmark queries with the Go SDK
// (docs/nexmark.md): config query q0, q1 or q2, stage map. Each reads the
// nexmark source's events in place (sdk/go/nexmark) and writes CSV lines
// into one reused buffer with streamd.AppendInt, so a record costs no
// allocation.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o nexmark_go.wasm .
package main

import (
	"fmt"

	streamd "github.com/streamd/streamd/sdk/go"
	"github.com/streamd/streamd/sdk/go/nexmark"
)

type query struct {
	streamd.Base
	each func(b nexmark.Bid, ts int64)
}

var buf []byte

func (q *query) Open(ctx *streamd.Context) error {
	switch name, stage := ctx.Config.String("query", ""), ctx.Config.String("stage", ""); {
	case stage != "map":
		return fmt.Errorf("nexmark_go, operator %q: stage %q (want map; the Go module has the stateless queries q0, q1, q2)", ctx.Operator, stage)
	case name == "q0":
		q.each = q0
	case name == "q1":
		q.each = q1
	case name == "q2":
		q.each = q2
	default:
		return fmt.Errorf("nexmark_go, operator %q: query %q (want q0, q1 or q2)", ctx.Operator, name)
	}
	return nil
}

func (q *query) ProcessElement(r streamd.Record, _ int) error {
	e, err := nexmark.Parse(r.Value)
	if err != nil {
		return err
	}
	if b, ok := e.Bid(); ok {
		q.each(b, r.Timestamp)
	}
	return nil
}

// bidLine is auction,bidder,price,date_time,extra. It builds the line in
// a local slice and stores it back in buf once: each store of a global
// slice costs three stores and a write-barrier check in Go's wasm code.
func bidLine(b nexmark.Bid, price, ts int64) {
	l := append(streamd.AppendInt(buf[:0], b.Auction()), ',')
	l = append(streamd.AppendInt(l, b.Bidder()), ',')
	l = append(streamd.AppendInt(l, price), ',')
	l = append(streamd.AppendInt(l, b.DateTime()), ',')
	l = append(l, b.Extra()...)
	streamd.Emit(nil, l, ts)
	buf = l
}

// q0, pass through.
func q0(b nexmark.Bid, ts int64) { bidLine(b, b.Price(), ts) }

// q1, currency conversion: 0.908 * price in whole cents, rounded down.
func q1(b nexmark.Bid, ts int64) { bidLine(b, b.Price()*908/1000, ts) }

// q2, selection: auction,price of the bids on every 123rd auction.
func q2(b nexmark.Bid, ts int64) {
	if b.Auction()%123 != 0 {
		return
	}
	l := append(streamd.AppendInt(buf[:0], b.Auction()), ',')
	l = streamd.AppendInt(l, b.Price())
	streamd.Emit(nil, l, ts)
	buf = l
}

func init() { streamd.Register(&query{}) }

func main() {}
