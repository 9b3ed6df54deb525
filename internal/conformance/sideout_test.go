package conformance

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
)

// sideoutGuests implement the sideout operator (guests/SPEC.md "sideout"):
// the imports emit_watermark, input_watermark and emit_to. The SDK guests
// join by adding their make target.
var sideoutGuests = []struct{ name, target string }{
	{"wat", "internal/conformance/guests/wat/sideout.wasm"},
	{"go", "internal/conformance/guests/go/sideout.wasm"},
	{"rust", "internal/conformance/guests/rust/sideout.wasm"},
}

// outputs records what the guest sends through host.Outputs.
type outputs struct {
	wms  []int64
	side map[string][]abi.Record
	in   []int64 // input watermarks the host answers with
}

func (o *outputs) EmitWatermark(ts int64) { o.wms = append(o.wms, ts) }
func (o *outputs) EmitTo(name string, recs []abi.Record) {
	if o.side == nil {
		o.side = map[string][]abi.Record{}
	}
	o.side[name] = append(o.side[name], recs...)
}
func (o *outputs) InputWatermark(in int) int64 { return o.in[in] }

func TestSideOutputs(t *testing.T) {
	for _, g := range sideoutGuests {
		t.Run(g.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t, g.name, guestPath(t, g.name, g.target))
			start := func(t *testing.T) (*sub, *outputs) {
				o := &outputs{in: []int64{abi.MinWatermark, abi.MinWatermark}}
				return h.start(t, h.plain, host.InstanceConfig{Operator: "sideout", NumInputs: 2, Outputs: o}), o
			}

			t.Run("routing", func(t *testing.T) {
				s, o := start(t)
				s.process(0, rec("k", "a1", 5), rec("k", "a2", 6), rec("", "x", 7), rec("k", "a3", 8))
				expect(t, "main output", s.take(), rec("k", "a2", 6), rec("", "x", 7))
				expect(t, "side output", o.side["side"], rec("k", "a1", 5), rec("k", "a3", 8))
				if s.inst.OwnsWatermark() || len(o.wms) != 0 {
					t.Errorf("owns watermark %v, emitted %v before any emit_watermark", s.inst.OwnsWatermark(), o.wms)
				}
			})

			t.Run("emit_watermark", func(t *testing.T) {
				s, o := start(t)
				s.process(1, rec("k", "wm", 100))
				s.watermark(5000) // on_watermark: emit_watermark(ts - 1000)
				s.watermark(abi.MaxWatermark)
				if want := []int64{100, 4000}; !slices.Equal(o.wms, want) {
					t.Errorf("emitted watermarks %v, want %v", o.wms, want)
				}
				if !s.inst.OwnsWatermark() {
					t.Error("OwnsWatermark false after emit_watermark")
				}
			})

			t.Run("input_watermark", func(t *testing.T) {
				s, o := start(t)
				s.process(0, rec("k", "iw", 1))
				o.in = []int64{42, abi.MaxWatermark}
				s.process(1, rec("k", "iw", 2))
				expect(t, "iw", s.take(),
					rec("k", "iw"+i64(abi.MinWatermark)+i64(abi.MinWatermark), 1),
					rec("k", "iw"+i64(42)+i64(abi.MaxWatermark), 2))
			})

			for _, c := range []struct{ value, want string }{
				{"badin", "input_watermark: input 7 outside [0, 2)"},
				{"badname", `emit_to: side-output name "bad name": byte 3 (' ') is not a letter, digit, '-' or '_'`},
			} {
				t.Run(c.value, func(t *testing.T) {
					s, _ := start(t)
					err := s.inst.Process(ctx, 0, []abi.Record{rec("k", c.value, 1)}, s.emit)
					var he *host.Error
					if !errors.As(err, &he) || !errors.Is(err, host.ErrHostCall) || he.Phase != abi.PhaseProcess || !strings.Contains(he.Message, c.want) {
						t.Fatalf("got %v, want a host-call misuse in process: %s", err, c.want)
					}
				})
			}

			t.Run("emit_watermark_in_finish", func(t *testing.T) {
				s, _ := start(t)
				s.process(0, rec("k", "wmfinish", 1))
				err := s.inst.Finish(ctx, s.emit)
				var he *host.Error
				if !errors.As(err, &he) || !errors.Is(err, host.ErrHostCall) || he.Phase != abi.PhaseFinish || !strings.Contains(he.Message, "emit_watermark not allowed in phase finish") {
					t.Fatalf("got %v, want emit_watermark refused in finish", err)
				}
			})
		})
	}
}
