package connector

import (
	"fmt"
	"strings"

	"github.com/streamd/streamd/internal/nexmark"
	"github.com/streamd/streamd/internal/roundrobin"
)

// The nexmark source: the Nexmark benchmark's event stream (Person,
// Auction, Bid), generated as Beam's NexmarkGenerator does (package
// internal/nexmark, docs/nexmark.md), in the compact binary encoding the
// SDKs read (sdk/go/nexmark, the Rust SDK's nexmark module).
func init() {
	MustRegisterSource("nexmark", NewConfigSpec().
		Summary("The Nexmark benchmark's events (Person, Auction, Bid at 1:3:46), as Beam's generator makes them, binary-encoded.").
		Description("Subtask i of p produces events i, i+p, i+2p, ... of the stream, so every parallelism sees the same events; "+
			"the position in a checkpoint is the next event number. It restores at another parallelism: new subtask j of p' produces "+
			"the events n ≡ j (mod p') that no old subtask produced, in order, each exactly once. Event time advances at event_rate from base_time, out of order "+
			"within groups of out_of_order_group_size, and the watermark stays below every later event of the subtask. "+
			"Bounded with events, unbounded with rate alone. See docs/nexmark.md.").
		Field(
			NewIntField("events").Description("Events in all, over all subtasks; 0 with rate: unbounded.").Default(int64(0)).Example(int64(1000000)),
			NewFloatField("rate").Description("Events per second of wall-clock time, over all subtasks; 0: as fast as it can.").Default(0.0),
			NewIntField("event_rate").Description("Events per second of event time (Beam's firstEventRate).").Default(int64(nexmark.DefaultEventRate)),
			NewIntField("base_time").Description("The first event's time, ms since the epoch.").Default(int64(nexmark.DefaultBaseTime)),
			NewIntField("seed").Description("Varies the random fields; 0: Beam's.").Default(int64(0)),
			NewIntField("out_of_order_group_size").Description("Events are permuted within groups of this many (1: in order).").Default(int64(1)),
		).
		Example("source: {type: nexmark, events: 10000000, event_rate: 10000}").
		Check(func(c Config) []FieldError {
			if err := nexmarkConfig(c).Check(); err != nil {
				field, msg, _ := strings.Cut(err.Error(), ": ")
				return []FieldError{Errorf(field, "%s", msg)}
			}
			return nil
		}).
		DescribeSource(func(s *SourceSpec) string {
			c := nexmarkConfig(s.Conf())
			d := fmt.Sprintf("source nexmark events=%d", c.Events)
			if c.Rate > 0 {
				d += fmt.Sprintf(" rate=%g/s", c.Rate)
			}
			return d
		}).
		RescalePositions(roundrobin.Rescale),
		func(s *SourceSpec, env SourceEnv) (Source, error) {
			return nexmark.NewSource(nexmarkConfig(s.Conf()), s.WatermarkLag, env.Subtask, env.Parallelism, env.Position)
		})
}

// nexmarkConfig is a nexmark source's configuration from its fields.
func nexmarkConfig(c Config) nexmark.Config {
	return nexmark.Config{Events: c.Int("events"), Rate: c.Float("rate"), EventRate: c.Int("event_rate"), BaseTime: c.Int("base_time"),
		Seed: c.Int("seed"), OutOfOrderGroupSize: c.Int("out_of_order_group_size")}.WithDefaults()
}
