package nexmark

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/roundrobin"
	sdk "github.com/streamd/streamd/sdk/go/nexmark"
)

// TestJavaRandom: the generator's Random is java.util.Random (values
// printed by Java 17).
func TestJavaRandom(t *testing.T) {
	r := newJavaRandom(42)
	if got := r.nextInt32(); got != -1170105035 {
		t.Errorf("Random(42).nextInt() = %d, want -1170105035", got)
	}
	r = newJavaRandom(0)
	if got := r.nextInt32(); got != -1155484576 {
		t.Errorf("Random(0).nextInt() = %d, want -1155484576", got)
	}
	r = newJavaRandom(0)
	if got := r.nextDouble(); got != 0.730967787376657 {
		t.Errorf("Random(0).nextDouble() = %v, want 0.730967787376657", got)
	}
	r = newJavaRandom(42)
	if got := r.nextDouble(); got != 0.7275636800328681 {
		t.Errorf("Random(42).nextDouble() = %v, want 0.7275636800328681", got)
	}
}

func events(t *testing.T, cfg Config, n int64) []Event {
	t.Helper()
	g := NewGenerator(cfg)
	var buf []byte
	out := make([]Event, n)
	for i := range n {
		var ts int64
		buf, ts = g.Append(buf[:0], i)
		e, err := Decode(buf)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if dt := eventTime(e); dt != ts {
			t.Fatalf("event %d: date_time %d, record time %d", i, dt, ts)
		}
		out[i] = e
	}
	return out
}

func eventTime(e Event) int64 {
	switch {
	case e.Person != nil:
		return e.Person.DateTime
	case e.Auction != nil:
		return e.Auction.DateTime
	}
	return e.Bid.DateTime
}

// TestEventMix checks the reference's documented properties over 100k
// events: 1:3:46 in every 50, consecutive person and auction ids from
// 1000, bids and auctions that refer to existing people and auctions or
// at most 10 ahead, categories 10-14, prices from 1 to 1,000,000 dollars
// (in cents), hot auctions and bidders in the documented shares, event
// time advancing 1e6/event_rate µs per event from the base time, sizes
// averaging the configured ones.
func TestEventMix(t *testing.T) {
	const n = 100_000
	evs := events(t, Config{}, n)
	var persons, auctions, bids int64
	lastPerson, lastAuction := int64(FirstPersonID-1), int64(FirstAuctionID-1)
	hotAuction, hotBidder := 0, 0
	var bidBytes, bidsSized int64
	for i, e := range evs {
		if want := DefaultBaseTime + int64(i)/10; eventTime(e) != want {
			t.Fatalf("event %d at %d, want %d (10k events/s from the base time)", i, eventTime(e), want)
		}
		rem := i % TotalProportion
		switch {
		case e.Person != nil:
			persons++
			if rem >= PersonProportion {
				t.Fatalf("event %d is a person at offset %d of 50", i, rem)
			}
			if e.Person.ID != lastPerson+1 {
				t.Fatalf("person id %d after %d", e.Person.ID, lastPerson)
			}
			lastPerson = e.Person.ID
			if !bytes.Contains([]byte("AZ CA ID OR WA WY"), []byte(e.Person.State)) || len(e.Person.State) != 2 {
				t.Fatalf("person state %q", e.Person.State)
			}
		case e.Auction != nil:
			auctions++
			a := e.Auction
			if rem < PersonProportion || rem >= PersonProportion+AuctionProportion {
				t.Fatalf("event %d is an auction at offset %d of 50", i, rem)
			}
			if a.ID != lastAuction+1 {
				t.Fatalf("auction id %d after %d", a.ID, lastAuction)
			}
			lastAuction = a.ID
			if a.Category < FirstCategoryID || a.Category >= FirstCategoryID+NumCategories {
				t.Fatalf("auction category %d", a.Category)
			}
			if a.Seller < FirstPersonID || a.Seller > lastPerson+personIDLead {
				t.Fatalf("auction %d: seller %d, last person %d", a.ID, a.Seller, lastPerson)
			}
			if a.Expires <= a.DateTime || a.Reserve <= a.InitialBid {
				t.Fatalf("auction %+v: expires before it starts or reserve not above the initial bid", a)
			}
		default:
			bids++
			b := e.Bid
			if rem < PersonProportion+AuctionProportion {
				t.Fatalf("event %d is a bid at offset %d of 50", i, rem)
			}
			if b.Auction < FirstAuctionID || b.Auction > lastAuction+auctionIDLead || b.Auction < lastAuction-NumInFlightAuctions-hotAuctionBatch {
				t.Fatalf("bid for auction %d, last auction %d", b.Auction, lastAuction)
			}
			if b.Bidder < FirstPersonID || b.Bidder > lastPerson+personIDLead {
				t.Fatalf("bid by %d, last person %d", b.Bidder, lastPerson)
			}
			if b.Price < 100 || b.Price > 100_000_000 {
				t.Fatalf("bid price %d cents", b.Price)
			}
			if b.Auction == (lastAuction-FirstAuctionID)/hotAuctionBatch*hotAuctionBatch+FirstAuctionID {
				hotAuction++
			}
			if b.Bidder == (lastPerson-FirstPersonID)/hotBidderBatch*hotBidderBatch+1+FirstPersonID {
				hotBidder++
			}
			bidBytes += 32 + int64(len(b.Extra))
			bidsSized++
		}
	}
	if persons*50 != n || auctions*50 != 3*n || bids*50 != 46*n {
		t.Fatalf("%d persons, %d auctions, %d bids in %d events, want 1:3:46", persons, auctions, bids, n)
	}
	share := func(x int) float64 { return float64(x) / float64(bids) }
	// P(hot) = 1 - 1/ratio, plus the random picks that hit it.
	if s := share(hotAuction); s < 0.48 || s > 0.56 {
		t.Errorf("%.3f of the bids for the hot auction, want about 1-1/%d", s, HotAuctionRatio)
	}
	if s := share(hotBidder); s < 0.73 || s > 0.78 {
		t.Errorf("%.3f of the bids by the hot bidder, want about 1-1/%d", s, HotBiddersRatio)
	}
	if avg := float64(bidBytes) / float64(bidsSized); avg < 95 || avg > 105 {
		t.Errorf("bids average %.1f bytes (Beam's size measure), want about %d", avg, AvgBidByteSize)
	}
}

// TestDeterministic: the same config gives the same bytes, a seed other ones.
func TestDeterministic(t *testing.T) {
	a, b, c := NewGenerator(Config{}), NewGenerator(Config{}), NewGenerator(Config{Seed: 7})
	same := 0
	for n := range int64(1000) {
		x, _ := a.Append(nil, n)
		y, _ := b.Append(nil, n)
		z, _ := c.Append(nil, n)
		if !bytes.Equal(x, y) {
			t.Fatalf("event %d differs between two generators", n)
		}
		if bytes.Equal(x, z) {
			same++
		}
	}
	if same > 10 {
		t.Errorf("seed 7 gives the same bytes as seed 0 for %d of 1000 events", same)
	}
}

// TestOutOfOrder: with groups of 10 the events are permuted within each
// group, and the watermark stays below every later event.
func TestOutOfOrder(t *testing.T) {
	g := NewGenerator(Config{OutOfOrderGroupSize: 10, EventRate: 1000})
	inOrder := NewGenerator(Config{EventRate: 1000})
	seen := map[string]bool{}
	disorder := 0
	var prev int64
	minLater := make([]int64, 2001)
	tss := make([]int64, 2000)
	for n := range int64(2000) {
		b, ts := g.Append(nil, n)
		tss[n] = ts
		seen[string(b)] = true
		if ts < prev {
			disorder++
		}
		prev = ts
	}
	minLater[2000] = 1 << 62
	for n := 1999; n >= 0; n-- {
		minLater[n] = min(minLater[n+1], tss[n])
	}
	for n := range int64(1990) {
		if w := g.Watermark(n); w > minLater[n] {
			t.Fatalf("watermark %d before event %d is above a later event's time %d", w, n, minLater[n])
		}
		b, _ := inOrder.Append(nil, n)
		if !seen[string(b)] {
			t.Fatalf("in-order event %d is not among the permuted ones", n)
		}
	}
	if disorder == 0 {
		t.Fatal("no event earlier than the one before it")
	}
}

// TestSourceSplitResume: the subtasks' events together are the stream, a
// source resumed from its position continues where it stopped, and the
// watermark trails the events.
func TestSourceSplitResume(t *testing.T) {
	const total = 5000
	g := NewGenerator(Config{})
	cfg := Config{Events: total}
	got := map[string]int{}
	for sub := range 3 {
		s, err := NewSource(cfg, 0, sub, 3, nil)
		if err != nil {
			t.Fatal(err)
		}
		recs := make([]abi.Record, 100)
		reads := 0
		for {
			wm := s.Watermark()
			k, err := s.Read(context.Background(), recs)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs[:k] {
				got[string(r.Value)]++
				if r.Timestamp <= wm {
					t.Fatalf("record at %d not above the watermark %d before it", r.Timestamp, wm)
				}
			}
			if reads++; reads == 5 { // resume from the position
				if s, err = NewSource(cfg, 0, sub, 3, s.Position()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for n := range int64(total) {
		b, _ := g.Append(nil, n)
		if got[string(b)] != 1 {
			t.Fatalf("event %d produced %d times", n, got[string(b)])
		}
	}
	if len(got) != total {
		t.Fatalf("%d distinct events, want %d", len(got), total)
	}
	if _, err := NewSource(cfg, 0, 1, 3, []byte{1, 0, 0, 0, 0, 0, 0, 0, 3}); err == nil {
		t.Fatal("a position of subtask 0 was accepted by subtask 1")
	}
	if _, err := NewSource(Config{}, 0, 0, 1, nil); err == nil {
		t.Fatal("a source with neither events nor rate was accepted")
	}
}

func TestParseRejects(t *testing.T) {
	b, _ := NewGenerator(Config{}).Append(nil, 5)
	for _, bad := range [][]byte{nil, {3}, b[:10], b[:len(b)-1], append(append([]byte{}, b...), 0)} {
		if _, err := sdk.Parse(bad); err == nil {
			t.Errorf("Parse(%x) accepted", bad)
		}
	}
}

func BenchmarkAppend(b *testing.B) {
	g := NewGenerator(Config{})
	var buf []byte
	for i := 0; b.Loop(); i++ {
		buf, _ = g.Append(buf[:0], int64(i))
	}
}

func TestParseCount(t *testing.T) {
	for s, want := range map[string]int64{"100000": 100000, "100K": 100000, "10M": 10_000_000, "1G": 1_000_000_000} {
		if got, err := ParseCount(s); err != nil || got != want {
			t.Errorf("ParseCount(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "M", "-5", "0", "ten", "1.5M"} {
		if _, err := ParseCount(s); err == nil {
			t.Errorf("ParseCount(%q) accepted", s)
		}
	}
}

// A source checkpointed at p=2, rescaled to 3 and then to 1 (before every
// subtask is past the first rescale) produces every event exactly once,
// each subtask in order and above the watermark it had before.
func TestSourceRescale(t *testing.T) {
	const total = 4000
	g := NewGenerator(Config{})
	for _, cfg := range []Config{{Events: total}, {Events: total, OutOfOrderGroupSize: 7}} {
		want := map[string]int64{}
		for n := range int64(total) {
			b, _ := g.Append(nil, n)
			if cfg.OutOfOrderGroupSize > 1 {
				b, _ = NewGenerator(cfg.WithDefaults()).Append(nil, n)
			}
			want[string(b)] = n
		}
		seen := map[string]int{}
		var pos [][]byte
		for _, st := range []struct{ p, reads int }{{2, 0}, {3, 0}, {1, -1}} {
			if pos != nil {
				var err error
				if pos, err = roundrobin.Rescale(pos, st.p); err != nil {
					t.Fatal(err)
				}
			}
			next := make([][]byte, st.p)
			for j := range st.p {
				var at []byte
				if pos != nil {
					at = pos[j]
				}
				s, err := NewSource(cfg, 0, j, st.p, at)
				if err != nil {
					t.Fatalf("subtask %d of %d: %v", j, st.p, err)
				}
				limit := 90 * (j + 1) * st.p // uneven prefixes
				if st.reads < 0 {
					limit = total
				}
				recs := make([]abi.Record, 11)
				last := int64(-1)
				for read := 0; read < limit; {
					wm := s.Watermark()
					k, err := s.Read(context.Background(), recs[:min(len(recs), limit-read)])
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					for _, r := range recs[:k] {
						n, ok := want[string(r.Value)]
						if !ok || n <= last || n%int64(st.p) != int64(j) {
							t.Fatalf("subtask %d of %d: event %d (known %v) after %d", j, st.p, n, ok, last)
						}
						if r.Timestamp <= wm {
							t.Fatalf("event %d at %d not above the watermark %d before it", n, r.Timestamp, wm)
						}
						seen[string(r.Value)]++
						last = n
					}
					read += k
				}
				if s.left() != 0 {
					next[j] = s.Position()
				}
			}
			pos = next
		}
		for b, n := range want {
			if seen[b] != 1 {
				t.Fatalf("event %d produced %d times", n, seen[b])
			}
		}
	}
}
