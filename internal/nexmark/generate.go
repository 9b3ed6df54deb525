package nexmark

import (
	"math"

	sdk "github.com/streamd/streamd/sdk/go/nexmark"
)

var (
	usStates   = []string{"AZ", "CA", "ID", "OR", "WA", "WY"}
	usCities   = []string{"Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"}
	firstNames = []string{"Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"}
	lastNames  = []string{"Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"}
)

// Generator computes event n of the stream of a Config.
type Generator struct {
	cfg     Config
	delayUs int64 // inter-event delay in µs
	enc     encoder
}

// NewGenerator returns the generator of cfg (defaults filled in).
func NewGenerator(cfg Config) *Generator {
	cfg = cfg.WithDefaults()
	return &Generator{cfg: cfg, delayUs: 1_000_000 / cfg.EventRate}
}

// Config is the generator's configuration, defaults filled in.
func (g *Generator) Config() Config { return g.cfg }

// Timestamp is the event time of event number n (Beam's
// timestampAndInterEventDelayUsForEvent with one rate).
func (g *Generator) Timestamp(n int64) int64 { return g.cfg.BaseTime + n*g.delayUs/1000 }

// adjusted is Beam's nextAdjustedEventNumber: the number whose id and time
// event n takes, permuted within its out-of-order group.
func (g *Generator) adjusted(n int64) int64 {
	k := g.cfg.OutOfOrderGroupSize
	return n/k*k + n*953%k
}

// Watermark is the least event time of event n and every later one (Beam's
// nextEventNumberForWatermark): a source about to produce n has seen every
// event time below it.
func (g *Generator) Watermark(n int64) int64 {
	k := g.cfg.OutOfOrderGroupSize
	return g.Timestamp(n / k * k)
}

// Append appends the encoding of event n to dst and returns it with the
// event's time.
func (g *Generator) Append(dst []byte, n int64) ([]byte, int64) {
	num := g.adjusted(n)
	id := num // firstEventId 0
	ts := g.Timestamp(num)
	r := newJavaRandom(id ^ g.cfg.Seed)
	e := &g.enc
	switch rem := id % TotalProportion; {
	case rem < PersonProportion:
		g.person(e, dst, id, &r, ts)
	case rem < PersonProportion+AuctionProportion:
		g.auction(e, dst, n, id, &r, ts)
	default:
		g.bid(e, dst, id, &r, ts)
	}
	dst, e.dst = e.dst, nil
	return dst, ts
}

// lastBase0PersonID is the last valid person id (base 0) at event id.
func lastBase0PersonID(id int64) int64 {
	epoch, off := id/TotalProportion, id%TotalProportion
	if off >= PersonProportion {
		off = PersonProportion - 1
	}
	return epoch*PersonProportion + off
}

// lastBase0AuctionID is the last valid auction id (base 0) at event id.
func lastBase0AuctionID(id int64) int64 {
	epoch, off := id/TotalProportion, id%TotalProportion
	switch {
	case off < PersonProportion:
		epoch--
		off = AuctionProportion - 1
	case off >= PersonProportion+AuctionProportion:
		off = AuctionProportion - 1
	default:
		off -= PersonProportion
	}
	return epoch*AuctionProportion + off
}

// nextBase0PersonID is a random active person, or one a little ahead.
func nextBase0PersonID(id int64, r *javaRandom) int64 {
	people := lastBase0PersonID(id) + 1
	active := min(people, NumActivePeople)
	return people - active + r.nextLongN(active+personIDLead)
}

// nextBase0AuctionID is a random in-flight auction, or one a little ahead.
func nextBase0AuctionID(id int64, r *javaRandom) int64 {
	maxA := lastBase0AuctionID(id)
	minA := max(maxA-NumInFlightAuctions, 0)
	return minA + r.nextLongN(maxA-minA+1+auctionIDLead)
}

func nextPrice(r *javaRandom) int64 {
	return int64(math.Floor(math.Pow(10, r.nextDouble()*6)*100 + 0.5))
}

// appendString is StringsGenerator.nextString: 3 to maxLen-1 letters and
// spaces, trimmed.
func appendString(dst []byte, r *javaRandom, maxLen int32) []byte {
	start := len(dst)
	for n := 3 + r.nextInt(maxLen-3); n > 0; n-- {
		if r.nextInt(13) == 0 {
			dst = append(dst, ' ')
		} else {
			dst = append(dst, byte('a'+r.nextInt(26)))
		}
	}
	s := dst[start:]
	i, j := 0, len(s)
	for i < j && s[i] == ' ' {
		i++
	}
	for j > i && s[j-1] == ' ' {
		j--
	}
	return append(dst[:start], s[i:j]...)
}

// appendExtra is StringsGenerator.nextExtra: padding so the event's size
// averages avg.
func appendExtra(dst []byte, r *javaRandom, size, avg int) []byte {
	if size > avg {
		return dst
	}
	avg -= size
	delta := int(math.Floor(float64(avg)*0.2 + 0.5))
	n := avg - delta
	if delta != 0 {
		n += int(r.nextInt(int32(2 * delta)))
	}
	// nextExactString: six letters from each nextInt, Java's signed % and /.
	var rnd int32
	left := 0
	for ; n > 0; n-- {
		if left == 0 {
			rnd, left = r.nextInt32(), 6
		}
		dst = append(dst, byte('a'+rnd%26))
		rnd /= 26
		left--
	}
	return dst
}

func (g *Generator) person(e *encoder, dst []byte, id int64, r *javaRandom, ts int64) {
	e.begin(dst, KindPerson)
	e.setInt(sdk.PersonID, lastBase0PersonID(id)+FirstPersonID)
	e.setInt(sdk.PersonDateTime, ts)
	a := e.area()
	e.dst = append(e.dst, firstNames[r.nextInt(int32(len(firstNames)))]...)
	e.dst = append(e.dst, ' ')
	e.str(lastNames[r.nextInt(int32(len(lastNames)))])
	e.dst = appendString(e.dst, r, 7)
	e.dst = append(e.dst, '@')
	e.dst = appendString(e.dst, r, 5)
	e.str(".com")
	for i := range 4 {
		if i > 0 {
			e.dst = append(e.dst, ' ')
		}
		x := r.nextInt(10000)
		for d := int32(1000); d > 0; d /= 10 {
			e.dst = append(e.dst, byte('0'+x/d%10))
		}
	}
	e.endStr()
	e.str(usCities[r.nextInt(int32(len(usCities)))])
	e.str(usStates[r.nextInt(int32(len(usStates)))])
	e.dst = appendExtra(e.dst, r, 8+len(e.dst)-a, AvgPersonByteSize)
	e.endStr()
}

func (g *Generator) auction(e *encoder, dst []byte, n, id int64, r *javaRandom, ts int64) {
	e.begin(dst, KindAuction)
	e.setInt(sdk.AuctionID, lastBase0AuctionID(id)+FirstAuctionID)
	var seller int64
	if r.nextInt(HotSellersRatio) > 0 {
		seller = lastBase0PersonID(id) / hotSellerBatch * hotSellerBatch
	} else {
		seller = nextBase0PersonID(id, r)
	}
	e.setInt(sdk.AuctionSeller, seller+FirstPersonID)
	e.setInt(sdk.AuctionCategory, FirstCategoryID+int64(r.nextInt(NumCategories)))
	initial := nextPrice(r)
	e.setInt(sdk.AuctionInitialBid, initial)
	// nextAuctionLengthMs: on average twice the time until
	// NumInFlightAuctions more auctions.
	ahead := int64(NumInFlightAuctions * TotalProportion / AuctionProportion)
	horizon := g.Timestamp(g.adjusted(n)+ahead) - ts
	e.setInt(sdk.AuctionExpires, ts+1+r.nextLongN(max(horizon*2, 1)))
	e.setInt(sdk.AuctionDateTime, ts)
	a := e.area()
	e.dst = appendString(e.dst, r, 20)
	e.endStr()
	e.dst = appendString(e.dst, r, 100)
	e.endStr()
	e.setInt(sdk.AuctionReserve, initial+nextPrice(r))
	e.dst = appendExtra(e.dst, r, 8+len(e.dst)-a+5*8, AvgAuctionByteSize)
	e.endStr()
}

func (g *Generator) bid(e *encoder, dst []byte, id int64, r *javaRandom, ts int64) {
	e.begin(dst, KindBid)
	var auction, bidder int64
	if r.nextInt(HotAuctionRatio) > 0 {
		auction = lastBase0AuctionID(id) / hotAuctionBatch * hotAuctionBatch
	} else {
		auction = nextBase0AuctionID(id, r)
	}
	if r.nextInt(HotBiddersRatio) > 0 {
		bidder = lastBase0PersonID(id)/hotBidderBatch*hotBidderBatch + 1
	} else {
		bidder = nextBase0PersonID(id, r)
	}
	e.setInt(sdk.BidAuction, auction+FirstAuctionID)
	e.setInt(sdk.BidBidder, bidder+FirstPersonID)
	e.setInt(sdk.BidPrice, nextPrice(r))
	e.setInt(sdk.BidDateTime, ts)
	e.dst = appendExtra(e.dst, r, 8+8+8+8, AvgBidByteSize)
	e.endStr()
}
