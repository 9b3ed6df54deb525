package control

import (
	"fmt"
	"strings"
	"testing"
)

// TestWatermarkIdleness: an idle channel does not hold back the subtask's
// watermark; when every open channel is idle the subtask is idle
// downstream; a watermark or an active status makes a channel count again.
// InputWatermark is per input and leaves idle channels out.
func TestWatermarkIdleness(t *testing.T) {
	m, err := NewSubtaskMachine(SubtaskConfig{ID: SubtaskID{Operator: "op"}, Channels: []int{0, 0, 1}, Inputs: 2, Outputs: 1})
	if err != nil {
		t.Fatal(err)
	}
	step := func(ev SubtaskEvent, want string) {
		t.Helper()
		if err := m.Step(ev); err != nil {
			t.Fatalf("%s: %v", ev, err)
		}
		var got []string
		for _, a := range m.Ready() {
			got = append(got, fmt.Sprint(a))
		}
		m.Advance()
		if s := strings.Join(got, "; "); s != want {
			t.Fatalf("%s: actions %q, want %q", ev, s, want)
		}
	}
	inputs := func(want string) {
		t.Helper()
		if got := fmt.Sprintf("%d %d", m.InputWatermark(0), m.InputWatermark(1)); got != want {
			t.Fatalf("input watermarks %s, want %s", got, want)
		}
	}
	step(Opened{}, "")
	step(ChannelWatermark{Channel: 0, TS: 5}, "")
	step(ChannelWatermark{Channel: 2, TS: 7}, "")
	inputs(fmt.Sprintf("%d 7", MinWatermark))
	step(ChannelWatermarkStatus{Channel: 1, Idle: true}, "watermark ts=5")
	inputs("5 7")
	step(ChannelWatermarkStatus{Channel: 0, Idle: true}, "watermark ts=7")
	inputs(fmt.Sprintf("%d 7", MinWatermark))
	step(ChannelWatermarkStatus{Channel: 2, Idle: true}, "emit-watermark-status idle")
	if !m.Idle() {
		t.Fatal("not idle with every channel idle")
	}
	step(ChannelWatermarkStatus{Channel: 2, Idle: true}, "") // no change
	step(ChannelWatermark{Channel: 1, TS: 20}, "emit-watermark-status active; watermark ts=20")
	step(ChannelWatermarkStatus{Channel: 2, Idle: false}, "") // 7 < 20: held back until it catches up
	step(ChannelWatermarkStatus{Channel: 0, Idle: false}, "")
	inputs("5 7")
	step(ChannelWatermark{Channel: 0, TS: 30}, "")
	step(ChannelWatermark{Channel: 2, TS: 30}, "")
	step(ChannelWatermarkStatus{Channel: 1, Idle: true}, "watermark ts=30")
	step(ChannelEndOfData{Channel: 2, Drain: true}, "ack-end-of-data ch=2; end-input 1")
	step(ChannelEndOfPartition{Channel: 2}, "")
	inputs(fmt.Sprintf("30 %d", MaxWatermark))
}
