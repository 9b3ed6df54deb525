package jobfile

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/nexmark"
)

func TestNexmarkSource(t *testing.T) {
	path := fixture(t, `
name: nx
operators:
  - uid: events
    source: {type: nexmark, events: 1000, rate: 500, event_rate: 1000, base_time: 5, seed: 3, out_of_order_group_size: 7, watermark: {max_out_of_orderness: 2s}}
  - uid: out
    sink: {type: discard}
    inputs: [events]
`)
	g, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	s := g.Vertex("events").Spec.(*SourceSpec)
	c := s.Conf()
	got := nexmark.Config{Events: c.Int("events"), Rate: c.Float("rate"), EventRate: c.Int("event_rate"), BaseTime: c.Int("base_time"),
		Seed: c.Int("seed"), OutOfOrderGroupSize: c.Int("out_of_order_group_size")}
	want := nexmark.Config{Events: 1000, Rate: 500, EventRate: 1000, BaseTime: 5, Seed: 3, OutOfOrderGroupSize: 7}
	if !reflect.DeepEqual(got, want) || s.WatermarkLag != 2*time.Second {
		t.Errorf("nexmark source = %+v, lag %v\nwant %+v, 2s", got, s.WatermarkLag, want)
	}
}

func TestNexmarkSourceInvalid(t *testing.T) {
	for _, tt := range []struct{ source, want string }{
		{"{type: nexmark}", `operator "events" (line 4): source.events: a nexmark source needs events`},
		{"{type: nexmark, events: -1}", `(line 4): source.events: must not be negative, got -1`},
		{"{type: nexmark, events: 10, event_rate: 2000000}", `source.event_rate: must be 1 to 1000000`},
		{"{type: nexmark, events: 10, out_of_order_group_size: 953}", `source.out_of_order_group_size: must be at least 1 and not a multiple of 953`},
		{"{type: nexmark, events: 10, count: 5}", `source.count: not a field of a nexmark source`},
		{"{type: nexmark, events: ten}", `source.events: want an integer`},
	} {
		path := fixture(t, "name: bad\noperators:\n  - uid: events\n    source: "+tt.source+"\n  - uid: out\n    sink: {type: discard}\n    inputs: [events]\n")
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.source, err, tt.want)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(path), "out")); !os.IsNotExist(err) {
			t.Errorf("%s: an invalid job created out/", tt.source)
		}
	}
}
