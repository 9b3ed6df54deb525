// Package nexmark is the Nexmark benchmark's event stream (docs/nexmark.md):
// people, auctions and bids of an online auction, generated as Beam's
// NexmarkGenerator (and nexmark-flink, which copies it) generates them, and
// encoded in a compact binary form the SDKs read without allocating.
//
// Event number n (0, 1, 2, ... over the whole source) is a pure function of
// n and the configuration: its kind (person : auction : bid = 1 : 3 : 46 by
// n mod 50), its ids, its event time (BaseTime + n * (1e6/EventRate) µs) and
// its random fields, drawn from a java.util.Random seeded with the event id
// as Beam does. So a run, a run at another parallelism and a resumed run all
// see the same events, and a reference computes them again in a test.
//
// Where it differs from the reference:
//
//   - One timeline, split round-robin: subtask i of p produces events
//     n = i, i+p, i+2p, ... of the single stream Beam's generator would
//     produce alone. Beam splits into id ranges on parallel timelines
//     (each split restarts event time at BaseTime); here the union over the
//     subtasks is the same stream at every parallelism.
//   - Seed: event id XOR Seed seeds the Random (Seed 0, the default, is Beam's).
//     nexmark-flink draws from one unseeded Random, so its fields are not
//     reproducible at all.
//   - Proportions, hot ratios, in-flight auctions, active people and average
//     sizes are fixed at nexmark-flink's defaults (see the constants); the
//     rate shape is a constant rate, and the wall-clock delays of Beam's
//     unbounded source (probDelayedEvent, occasionalDelaySec) are not
//     simulated. Out-of-orderness is Beam's outOfOrderGroupSize: within
//     groups of that many events the ids and timestamps are permuted.
//   - Bid has Beam's five fields (no channel and url of later nexmark-flink).
//   - Prices use Go's math.Pow; Java's Math.pow may differ in the last bit,
//     which can move a price by one cent in rare cases.
package nexmark

import "fmt"

// The reference generator's constants (GeneratorConfig, *Generator.java and
// nexmark-flink's NexmarkConfiguration defaults).
const (
	FirstPersonID   = 1000
	FirstAuctionID  = 1000
	FirstCategoryID = 10
	NumCategories   = 5

	PersonProportion  = 1
	AuctionProportion = 3
	BidProportion     = 46
	TotalProportion   = PersonProportion + AuctionProportion + BidProportion

	personIDLead  = 10
	auctionIDLead = 10
	// Bids for a hot auction go to the first of the last hotAuctionBatch
	// auctions, and so on.
	hotAuctionBatch = 100
	hotBidderBatch  = 100
	hotSellerBatch  = 100

	HotAuctionRatio     = 2 // 1 - 1/2 of the bids are for a hot auction
	HotSellersRatio     = 4 // 1 - 1/4 of the auctions are by a hot seller
	HotBiddersRatio     = 4 // 1 - 1/4 of the bids are by a hot bidder
	NumInFlightAuctions = 100
	NumActivePeople     = 1000

	AvgPersonByteSize  = 200
	AvgAuctionByteSize = 500
	AvgBidByteSize     = 100

	// DefaultBaseTime is Beam's BASE_TIME, 2015-07-15T00:00:00Z, in ms.
	DefaultBaseTime = 1436918400000
	// DefaultEventRate is Beam's firstEventRate: events per second of event time.
	DefaultEventRate = 10000
)

// Config is a nexmark source's configuration (job file: source type nexmark).
type Config struct {
	// Events bounds the stream: events over all subtasks; 0: unbounded.
	Events int64 `json:"events,omitempty"`
	// Rate paces the source: events per second of wall-clock time over all
	// subtasks; 0: as fast as it can.
	Rate float64 `json:"rate,omitempty"`
	// EventRate is how fast event time advances: events per second of event
	// time (inter-event delay 1e6/EventRate µs, rounded down as in Beam).
	EventRate int64 `json:"event_rate,omitempty"`
	// BaseTime is the first event's time, ms since the epoch.
	BaseTime int64 `json:"base_time,omitempty"`
	// Seed varies the random fields (0: Beam's).
	Seed int64 `json:"seed,omitempty"`
	// OutOfOrderGroupSize is Beam's outOfOrderGroupSize: events are permuted
	// within groups of this many (1: in order).
	OutOfOrderGroupSize int64 `json:"out_of_order_group_size,omitempty"`
}

// WithDefaults fills the zero fields that have a default.
func (c Config) WithDefaults() Config {
	if c.EventRate == 0 {
		c.EventRate = DefaultEventRate
	}
	if c.BaseTime == 0 {
		c.BaseTime = DefaultBaseTime
	}
	if c.OutOfOrderGroupSize == 0 {
		c.OutOfOrderGroupSize = 1
	}
	return c
}

// Check reports the first invalid field, by its job-file name.
func (c Config) Check() error {
	switch {
	case c.Events < 0:
		return fmt.Errorf("events: must not be negative, got %d", c.Events)
	case c.Rate < 0 || c.Rate != c.Rate:
		return fmt.Errorf("rate: must be a non-negative number of events per second, got %v", c.Rate)
	case c.Events == 0 && c.Rate == 0:
		return fmt.Errorf("events: a nexmark source needs events (in total) or rate (events per second; unbounded without events)")
	case c.EventRate < 1 || c.EventRate > 1_000_000:
		return fmt.Errorf("event_rate: must be 1 to 1000000 events per second of event time, got %d", c.EventRate)
	case c.OutOfOrderGroupSize < 1 || c.OutOfOrderGroupSize%953 == 0:
		return fmt.Errorf("out_of_order_group_size: must be at least 1 and not a multiple of 953, got %d", c.OutOfOrderGroupSize)
	}
	return nil
}
