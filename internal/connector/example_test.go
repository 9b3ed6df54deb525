package connector

import (
	"context"
	"fmt"
	"io"

	"github.com/streamd/streamd/abi"
)

// ticks is the example's source: count records, then the end.
type ticks struct{ next, count int64 }

func (t *ticks) Read(_ context.Context, recs []abi.Record) (int, error) {
	if t.next >= t.count {
		return 0, io.EOF
	}
	recs[0] = abi.Record{Value: fmt.Appendf(nil, "tick %d", t.next), Timestamp: abi.NoTimestamp}
	t.next++
	return 1, nil
}
func (t *ticks) Watermark() int64 { return abi.MinWatermark }
func (t *ticks) Position() []byte { return fmt.Appendf(nil, "%d", t.next) }
func (t *ticks) Close() error     { return nil }

// A source registers its name, its fields and its constructor; the job
// file's values reach the constructor checked, with their defaults.
func ExampleRegisterSource() {
	MustRegisterSource("example_ticks", NewConfigSpec().
		Summary("Counts ticks.").
		Field(NewIntField("count").Description("How many ticks.").Default(int64(3))),
		func(s *SourceSpec, env SourceEnv) (Source, error) {
			return &ticks{count: s.Conf().Int("count")}, nil
		})
	defer Unregister("source", "example_ticks")

	// What the loader makes of `source: {type: example_ticks, count: 2}`.
	p, _ := LookupSource("example_ticks")
	spec := &SourceSpec{Type: "example_ticks"}
	p.BindSource(Config{"count": int64(2)}, spec)
	fmt.Println(DescribeSource(spec))

	src, _ := NewSource(spec, SourceEnv{Subtask: 0, Parallelism: 1})
	recs := make([]abi.Record, 8)
	for {
		n, err := src.Read(context.Background(), recs)
		if err != nil {
			break
		}
		fmt.Printf("%s (position %s)\n", recs[:n][0].Value, src.Position())
	}
	// Output:
	// source example_ticks count=2
	// tick 0 (position 1)
	// tick 1 (position 2)
}
