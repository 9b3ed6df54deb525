package cluster

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/natstest"
	"github.com/streamd/streamd/internal/testlog"
)

// TestControllerReportsAStalledTick: a tick that waits for the controller's
// mutex longer than stallReport is logged, with every goroutine's stack,
// the waiting ticker's among them.
func TestControllerReportsAStalledTick(t *testing.T) {
	defer func(d time.Duration) { stallReport = d }(stallReport)
	stallReport = 200 * time.Millisecond
	srv := natstest.Server(t)
	logs := testlog.New()
	c, err := StartController(natstest.Connect(t, srv.URL()), ControllerOptions{HeartbeatInterval: 50 * time.Millisecond, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	for deadline := time.Now().Add(10 * time.Second); c.leaderTerm() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the controller did not lead within 10s")
		}
	}
	stalls := func() []testlog.Record {
		var out []testlog.Record
		for _, r := range logs.Records() {
			if strings.HasPrefix(r.Msg, "controller stalled") {
				out = append(out, r)
			}
		}
		return out
	}
	if n := len(stalls()); n != 0 {
		t.Fatalf("%d stall reports before any stall", n)
	}
	c.mu.Lock()
	for deadline := time.Now().Add(10 * time.Second); len(stalls()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.mu.Unlock()
			t.Fatal("no stall report with the mutex held for 10s")
		}
	}
	c.mu.Unlock()
	got := stalls()[0]
	if !strings.Contains(got.Attrs["stacks"], "(*Controller).ticker") || got.Level != "WARN" {
		t.Fatalf("stall report %+v: want a warning with the ticker's stack", got)
	}
}
