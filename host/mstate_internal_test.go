package host

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/streamd/streamd/abi"
)

// TestMemoryCutDropsExpired: the memory backend drops expired structured
// entries and list elements when it cuts, keeps its index in step, and the
// copy-on-write cut does not see later writes.
func TestMemoryCutDropsExpired(t *testing.T) {
	const maxP = 16
	s := backendIn(t, BackendMemory, maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, "")
	addStructuredAndProcTimers(t, s, maxP)
	cut, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	if err := cut.Load(); err != nil { // the timers are read here
		t.Fatal(err)
	}
	checkStructuredAndProcTimers(t, cut.KeyGroups)
	key := []byte("m0")
	kg := abi.KeyGroup(key, maxP)
	prefix := appendEntryPrefix(nil, key, []byte("ns"))
	var ukeys []string
	scan := func() string {
		ukeys = ukeys[:0]
		if err := s.scan(kg, []byte("\x00st"), prefix, func(uk, _ []byte) error {
			ukeys = append(ukeys, string(uk))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(ukeys)
	}
	if got := scan(); got != "[list live]" {
		t.Errorf("index after the cut: %s, want [list live]", got)
	}
	// Writes after the cut: the cut keeps what it had.
	if err := s.del(kg, []byte("\x00st"), append(prefix, "live"...)); err != nil {
		t.Fatal(err)
	}
	if err := s.put(kg, []byte("\x00st"), append(prefix, "new"...), storedValue(0, "n")); err != nil {
		t.Fatal(err)
	}
	if got := scan(); got != "[list new]" {
		t.Errorf("index after writes: %s, want [list new]", got)
	}
	checkStructuredAndProcTimers(t, cut.KeyGroups)
	cut.Release()
}

// TestPebbleSweepExpired: the TTL sweep of incremental checkpoints drops
// expired entries and elements a bounded number at a time, resumes where it
// stopped, skips the other states, and wraps around.
func TestPebbleSweepExpired(t *testing.T) {
	const maxP = 16
	s := backendIn(t, BackendPebble, maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, t.TempDir()).(*pebbleState)
	for i := range 200 {
		key := []byte(fmt.Sprintf("plain%d", i))
		if err := s.put(abi.KeyGroup(key, maxP), []byte("count"), key, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	addStructuredAndProcTimers(t, s, maxP) // 150 structured entries, 50 expired, 50 lists trimmed
	raw := func() (dead, lists int) {
		now := s.now()
		for _, g := range rawGroups(t, s) {
			for _, v := range g.Entries["\x00st"] {
				live, keep := liveValue(v, now)
				switch {
				case !keep:
					dead++
				case !bytes.Equal(live, v):
					lists++
				}
			}
		}
		return dead, lists
	}
	if d, l := raw(); d != 50 || l != 50 {
		t.Fatalf("before the sweep: %d dead, %d lists to trim", d, l)
	}
	if err := s.sweepExpired(30); err != nil {
		t.Fatal(err)
	}
	if d, l := raw(); d+l < 100-30 || d+l == 100 {
		t.Fatalf("after one sweep of 30: %d dead, %d lists to trim left, want about 70", d, l)
	}
	for range 5 {
		if err := s.sweepExpired(30); err != nil {
			t.Fatal(err)
		}
	}
	if d, l := raw(); d != 0 || l != 0 {
		t.Fatalf("after sweeping everything: %d dead, %d lists to trim left", d, l)
	}
	g := rawGroups(t, s)
	n := 0
	for _, kg := range g {
		n += len(kg.Entries["count"])
	}
	if n != 200 {
		t.Errorf("the sweep touched other states: %d of 200 left", n)
	}
}

// rawGroups reads every stored entry of a pebble backend, expired or not.
func rawGroups(t *testing.T, s *pebbleState) map[int]*KeyGroupState {
	t.Helper()
	if err := s.flushRows(); err != nil { // the writes the row cache holds back
		t.Fatal(err)
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	g, err := s.readCut(snap, 0) // now 0: nothing has expired
	if err != nil {
		t.Fatal(err)
	}
	return g
}
