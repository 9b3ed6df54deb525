package nexmark_test

import (
	"fmt"
	"sort"

	"github.com/streamd/streamd/internal/nexmark"
)

// The reference: each query's definition in plain Go over the decoded
// events, its output as the sorted CSV lines the job writes.

const (
	window = 10_000 // ms: q4's closing-time windows, q5's size, q7, q8
	slide  = 2_000  // ms: q5
)

// generate decodes events 0..n-1 of cfg's stream.
func generate(cfg nexmark.Config, n int64) []nexmark.Event {
	g := nexmark.NewGenerator(cfg)
	evs := make([]nexmark.Event, n)
	var buf []byte
	for i := range n {
		buf, _ = g.Append(buf[:0], i)
		e, err := nexmark.Decode(buf)
		if err != nil {
			panic(fmt.Sprintf("event %d: %v", i, err))
		}
		evs[i] = e
	}
	return evs
}

func bids(evs []nexmark.Event) []*nexmark.Bid {
	var bs []*nexmark.Bid
	for _, e := range evs {
		if e.Bid != nil {
			bs = append(bs, e.Bid)
		}
	}
	return bs
}

func floorTo(ts, size int64) int64 { return ts - ((ts%size)+size)%size }

var references = map[string]func([]nexmark.Event) []string{
	// q0: SELECT auction, bidder, price, dateTime, extra FROM bid
	"q0": func(evs []nexmark.Event) (out []string) {
		for _, b := range bids(evs) {
			out = append(out, fmt.Sprintf("%d,%d,%d,%d,%s", b.Auction, b.Bidder, b.Price, b.DateTime, b.Extra))
		}
		return out
	},
	// q1: SELECT auction, bidder, 0.908 * price, dateTime, extra FROM bid
	"q1": func(evs []nexmark.Event) (out []string) {
		for _, b := range bids(evs) {
			out = append(out, fmt.Sprintf("%d,%d,%d,%d,%s", b.Auction, b.Bidder, b.Price*908/1000, b.DateTime, b.Extra))
		}
		return out
	},
	// q2: SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
	"q2": func(evs []nexmark.Event) (out []string) {
		for _, b := range bids(evs) {
			if b.Auction%123 == 0 {
				out = append(out, fmt.Sprintf("%d,%d", b.Auction, b.Price))
			}
		}
		return out
	},
	// q3: SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P
	// ON A.seller = P.id WHERE A.category = 10 AND P.state IN ('OR','ID','CA')
	"q3": func(evs []nexmark.Event) (out []string) {
		people := map[int64]*nexmark.Person{}
		for _, e := range evs {
			if p := e.Person; p != nil && (p.State == "OR" || p.State == "ID" || p.State == "CA") {
				people[p.ID] = p
			}
		}
		for _, e := range evs {
			if a := e.Auction; a != nil && a.Category == 10 {
				if p := people[a.Seller]; p != nil {
					out = append(out, fmt.Sprintf("%s,%s,%s,%d", p.Name, p.City, p.State, a.ID))
				}
			}
		}
		return out
	},
	// q4: per auction the highest bid with A.dateTime <= B.dateTime <=
	// A.expires, at the auction's expiry; averaged (rounded down) per
	// category and 10 s window of expiry.
	"q4": func(evs []nexmark.Event) (out []string) {
		auctions := map[int64]*nexmark.Auction{}
		for _, e := range evs {
			if a := e.Auction; a != nil {
				auctions[a.ID] = a
			}
		}
		best := map[int64]int64{}
		for _, b := range bids(evs) {
			if a := auctions[b.Auction]; a != nil && b.DateTime >= a.DateTime && b.DateTime <= a.Expires {
				if p, ok := best[a.ID]; !ok || b.Price > p {
					best[a.ID] = b.Price
				}
			}
		}
		type cw struct{ cat, w int64 }
		sum, n := map[cw]int64{}, map[cw]int64{}
		for id, p := range best {
			a := auctions[id]
			k := cw{a.Category, floorTo(a.Expires, window)}
			sum[k] += p
			n[k]++
		}
		for k := range n {
			out = append(out, fmt.Sprintf("%d,%d,%d,%d,%d", k.cat, k.w, k.w+window, n[k], sum[k]/n[k]))
		}
		return out
	},
	// q5: bids per auction in windows of 10 s sliding by 2 s; per window
	// the auctions with the most.
	"q5": func(evs []nexmark.Event) (out []string) {
		type aw struct{ a, end int64 }
		count := map[aw]int64{}
		for _, b := range bids(evs) {
			for end := floorTo(b.DateTime, slide) + slide; end-window <= b.DateTime; end += slide {
				count[aw{b.Auction, end}]++
			}
		}
		most := map[int64]int64{}
		for k, c := range count {
			most[k.end] = max(most[k.end], c)
		}
		for k, c := range count {
			if c == most[k.end] {
				out = append(out, fmt.Sprintf("%d,%d,%d,%d", k.a, c, k.end-window, k.end))
			}
		}
		return out
	},
	// q7: the bids with the highest price of each 10 s tumbling window.
	"q7": func(evs []nexmark.Event) (out []string) {
		most := map[int64]int64{}
		bs := bids(evs)
		for _, b := range bs {
			w := floorTo(b.DateTime, window)
			most[w] = max(most[w], b.Price)
		}
		for _, b := range bs {
			if b.Price == most[floorTo(b.DateTime, window)] {
				out = append(out, fmt.Sprintf("%d,%d,%d,%d,%s", b.Auction, b.Price, b.Bidder, b.DateTime, b.Extra))
			}
		}
		return out
	},
	// q8: people who opened an auction in the 10 s window they registered in.
	"q8": func(evs []nexmark.Event) (out []string) {
		type sw struct{ seller, w int64 }
		opened := map[sw]bool{}
		for _, e := range evs {
			if a := e.Auction; a != nil {
				opened[sw{a.Seller, floorTo(a.DateTime, window)}] = true
			}
		}
		for _, e := range evs {
			if p := e.Person; p != nil && opened[sw{p.ID, floorTo(p.DateTime, window)}] {
				out = append(out, fmt.Sprintf("%d,%s,%d", p.ID, p.Name, floorTo(p.DateTime, window)))
			}
		}
		return out
	},
}

func reference(q string, evs []nexmark.Event) []string {
	out := references[q](evs)
	sort.Strings(out)
	return out
}
