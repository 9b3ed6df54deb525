package jobfile

import (
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
)

const sideHead = `name: side
operators:
  - uid: lines
    source: {type: file, path: input.txt}
  - uid: count
    wasm: mods/count.wasm
    inputs: [lines]
`

// TestSideOutputInputs: from: OP.OUTPUT (and the shorthand) reads side
// output OUTPUT of the wasm operator OP.
func TestSideOutputInputs(t *testing.T) {
	g, err := Load(fixture(t, sideHead+`
  - uid: late
    sink: {type: stdout}
    inputs: [{from: count.late_records, partition: rebalance}, count.other-1, count]
`))
	if err != nil {
		t.Fatal(err)
	}
	got := g.Vertex("late").Inputs
	want := []control.Edge{
		{From: "count", To: "late", Partition: control.Rebalance, Input: 0, Output: "late_records"},
		{From: "count", To: "late", Partition: control.Forward, Input: 1, Output: "other-1"},
		{From: "count", To: "late", Partition: control.Forward, Input: 2},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("input %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestSideOutputInvalid(t *testing.T) {
	for _, c := range []struct{ name, inputs, want string }{
		{"from a source", "[lines.late]", `operator "out" (line 13): inputs[0].from: "lines.late": "lines" is a source; only a wasm operator has side outputs`},
		{"empty output", "[{from: count.}]", `operator "out" (line 13): inputs[0].from: "count.": empty side-output name after the '.' (want OP.OUTPUT)`},
		{"bad name", `[count, "count.late records"]`, `operator "out" (line 13): inputs[1].from: "count.late records": side-output name "late records": byte 4 (' ') is not a letter, digit, '-' or '_'`},
		{"too long", "[count." + strings.Repeat("x", 129) + "]", `side-output name of 129 bytes, over 128`},
		{"unknown operator", "[nope.late]", `operator "out" (line 13): inputs[0].from: unknown operator "nope"`},
		{"from a sink", "[sink2.late]", `operator "out" (line 13): inputs[0].from: "sink2" is a sink and has no output`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(fixture(t, sideHead+`
  - uid: sink2
    sink: {type: discard}
    inputs: [count]
  - uid: out
    sink: {type: stdout}
    inputs: `+c.inputs+`
`))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v\nwant %s", err, c.want)
			}
			if n := strings.Count(err.Error(), "inputs["); n != 1 {
				t.Errorf("%d problems with inputs, want 1: %v", n, err)
			}
		})
	}
}

// TestSourceWatermarkStrategy: timestamp: {field} and watermark: {...} on
// every source type that takes them, with their units and errors.
func TestSourceWatermarkStrategy(t *testing.T) {
	const job = "name: wm\noperators:\n  - uid: in\n    source: %s\n  - uid: out\n    sink: {type: stdout}\n    inputs: [in]\n"
	for _, c := range []struct {
		name, src string
		want      SourceSpec // the fields checked
		err       string
	}{
		{"file", `{type: file, path: input.txt, timestamp: {field: ts}, watermark: {max_out_of_orderness: 2s, idle_timeout: 30s, interval: 50ms}}`,
			SourceSpec{TimestampField: "ts", WatermarkLag: 2 * time.Second, IdleTimeout: 30 * time.Second, WatermarkInterval: 50 * time.Millisecond, TSStep: 1}, ""},
		{"nats", `{type: nats, stream: S, timestamp: {field: at}, watermark: {max_out_of_orderness: 1500}}`,
			SourceSpec{TimestampField: "at", WatermarkLag: 1500 * time.Millisecond, TSStep: 1}, ""},
		{"generator", `{type: generator, count: 1, ts_step: 2s, watermark: {idle_timeout: 1m}}`,
			SourceSpec{TSStep: 2000, IdleTimeout: time.Minute}, ""},
		{"ts_step integer", `{type: generator, count: 1, ts_step: 7, start_ts: 1700000000000}`,
			SourceSpec{TSStep: 7}, ""},
		{"watermark_lag alias", `{type: file, path: input.txt, watermark_lag: 3s}`, SourceSpec{WatermarkLag: 3 * time.Second, TSStep: 1}, ""},
		{"both lags", `{type: generator, count: 1, watermark_lag: 1s, watermark: {max_out_of_orderness: 2s}}`, SourceSpec{},
			`operator "in" (line 4): source.watermark.max_out_of_orderness: watermark_lag (line 4) is an alias of it: give one of them`},
		{"generator timestamp", `{type: generator, count: 1, timestamp: {field: ts}}`, SourceSpec{},
			`operator "in" (line 4): source.timestamp: not a field of a generator source`},
		{"timestamp without field", `{type: file, path: input.txt, timestamp: {}}`, SourceSpec{},
			`operator "in" (line 4): source.timestamp.field: missing: name the JSON field of the value that holds the event time`},
		{"timestamp scalar", `{type: file, path: input.txt, timestamp: ts}`, SourceSpec{},
			`operator "in" (line 4): source.timestamp: want a mapping like {field: ts}`},
		{"unknown watermark field", `{type: file, path: input.txt, watermark: {lag: 1s}}`, SourceSpec{},
			`source.watermark.lag: unknown field`},
		{"interval zero", `{type: file, path: input.txt, watermark: {interval: 0}}`, SourceSpec{},
			`operator "in" (line 4): source.watermark.interval: must be positive, got 0s`},
		{"idle integer", `{type: file, path: input.txt, watermark: {idle_timeout: 30}}`, SourceSpec{},
			`operator "in" (line 4): source.watermark.idle_timeout: want a duration like 500ms, 5s or 1m, got "30"`},
		{"ts_step sub-millisecond", `{type: generator, count: 1, ts_step: 1500us}`, SourceSpec{},
			`operator "in" (line 4): source.ts_step: timestamps are in milliseconds: 1.5ms is not a whole number of them`},
		{"start_ts duration", `{type: generator, count: 1, start_ts: 5s}`, SourceSpec{},
			`operator "in" (line 4): source.start_ts: `},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := Load(fixture(t, strings.Replace(job, "%s", c.src, 1)))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v\nwant %s", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := g.Vertex("in").Spec.(*SourceSpec)
			got := SourceSpec{TimestampField: s.TimestampField, WatermarkLag: s.WatermarkLag, IdleTimeout: s.IdleTimeout, WatermarkInterval: s.WatermarkInterval, TSStep: s.TSStep}
			if got != c.want {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}
