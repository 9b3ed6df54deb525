package conformance

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
)

// mstateGuests implement the structured-state operator (guests/SPEC.md,
// "mstate"). The SDK guests join by adding their make target here.
var mstateGuests = []struct{ name, target string }{
	{"wat", "internal/conformance/guests/wat/mstate.wasm"},
	{"go", "internal/conformance/guests/go/mstate.wasm"},
	{"rust", "internal/conformance/guests/rust/mstate.wasm"},
}

// mstateBackends are the state backends every mstate scenario runs on;
// cut says how a checkpoint is taken (full, or incremental as files).
var mstateBackends = []struct {
	name        string
	backend     string
	incremental bool
}{
	{"memory", host.BackendMemory, false},
	{"pebble", host.BackendPebble, false},
	{"pebble_incremental", host.BackendPebble, true},
}

var mstateScenarios = []struct {
	name string
	run  func(*testing.T, *mharness)
}{
	{"values_maps_lists", testMStateValuesMapsLists},
	{"namespaces_clear", testMStateNamespaces},
	{"ttl", testMStateTTL},
	{"ttl_dropped_at_snapshot", testMStateTTLSnapshot},
	{"restore_rescale", testMStateRescale},
	{"processing_timers", testProcessingTimers},
	{"processing_time_needs_allow_clock", testProcessingTimeClock},
	{"old_imports_refuse_nul_names", testOldNulName},
	{"state_ttl_only_in_open", testTTLOnlyInOpen},
	{"reject_undoes_structured_writes", testMStateUndo},
}

// TestMState runs the structured-state and processing-time scenarios over
// every mstate guest whose make target exists, on every backend.
func TestMState(t *testing.T) {
	for _, g := range mstateGuests {
		t.Run(g.name, func(t *testing.T) {
			h := newHarness(t, g.name, guestPath(t, g.name, g.target))
			for _, b := range mstateBackends {
				mh := &mharness{harness: *h, incremental: b.incremental}
				mh.state = host.StateConfig{Backend: b.backend, DataDir: t.TempDir(), Incremental: b.incremental}
				for _, sc := range mstateScenarios {
					t.Run(b.name+"/"+sc.name, func(t *testing.T) {
						mh.clock = &fakeClock{}
						mh.clock.set(1_000_000)
						sc.run(t, mh)
					})
				}
			}
		})
	}
}

type mharness struct {
	harness
	incremental bool
	clock       *fakeClock
}

type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) set(ms int64)         { c.ms.Store(ms) }
func (c *fakeClock) add(ms int64)         { c.ms.Add(ms) }
func (c *fakeClock) now() time.Time       { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) millis() int64        { return c.ms.Load() }
func (h *mharness) key(sub, p int) string { return keysIn(sub, p, 1)[0] }

// startM starts an mstate instance on the harness's clock.
func (h *mharness) startM(t *testing.T, cfg host.InstanceConfig) *msub {
	cfg.Clock = h.clock.now
	if cfg.Operator == "" {
		cfg.Operator = "mstate"
	}
	return &msub{sub: h.start(t, h.plain, cfg), h: h}
}

type msub struct {
	*sub
	h *mharness
}

// cmd is a command record value: op, then each field as u32le len + bytes.
func cmd(op byte, fields ...string) string {
	b := []byte{op}
	for _, f := range fields {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return string(b)
}

func i64(n int64) string { return string(binary.LittleEndian.AppendUint64(nil, uint64(n))) }

// do runs commands on key, one record each, in one batch.
func (s *msub) do(key string, cmds ...string) {
	s.t.Helper()
	recs := make([]abi.Record, len(cmds))
	for n, c := range cmds {
		recs[n] = rec(key, c, int64(n))
	}
	s.process(0, recs...)
}

// result runs a get or entries command and returns its result (nil, false: -1).
func (s *msub) result(key, c string) ([]byte, bool) {
	s.t.Helper()
	s.do(key, c)
	out := s.take()
	if len(out) != 1 || len(out[0].Value) < 5 || out[0].Value[0] != c[0] {
		s.t.Fatalf("command %q: emitted %s, want one result", c[0], show(out))
	}
	n := int32(binary.LittleEndian.Uint32(out[0].Value[1:]))
	if n == -1 {
		return nil, false
	}
	if int(n) != len(out[0].Value)-5 {
		s.t.Fatalf("command %q: result length %d, but %d bytes", c[0], n, len(out[0].Value)-5)
	}
	return out[0].Value[5:], true
}

func (s *msub) get(key, name, ns, ukey string) (string, bool) {
	s.t.Helper()
	v, ok := s.result(key, cmd('g', name, ns, ukey))
	return string(v), ok
}

// entries returns "ukey=val" of mstate_entries, in order ("" for none).
func (s *msub) entries(key, name, ns string) string {
	s.t.Helper()
	v, ok := s.result(key, cmd('e', name, ns))
	if !ok {
		return ""
	}
	n := binary.LittleEndian.Uint32(v)
	v = v[4:]
	var out []string
	for range n {
		kl := binary.LittleEndian.Uint32(v)
		uk := v[4 : 4+kl]
		v = v[4+kl:]
		vl := binary.LittleEndian.Uint32(v)
		out = append(out, fmt.Sprintf("%s=%s", uk, v[4:4+vl]))
		v = v[4+vl:]
	}
	if len(v) != 0 {
		s.t.Fatalf("entries frame has %d trailing bytes", len(v))
	}
	if len(out) == 0 {
		s.t.Fatalf("entries frame with no entries (want -1)")
	}
	return strings.Join(out, " ")
}

// list decodes a list frame to "[a b c]".
func list(t *testing.T, v string) string {
	t.Helper()
	b := []byte(v)
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	var out []string
	for range n {
		l := binary.LittleEndian.Uint32(b)
		out = append(out, string(b[4:4+l]))
		b = b[4+l:]
	}
	if len(b) != 0 {
		t.Fatalf("list frame has %d trailing bytes", len(b))
	}
	return "[" + strings.Join(out, " ") + "]"
}

func listFrame(elems ...string) string {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(elems)))
	for _, e := range elems {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e)))
		b = append(b, e...)
	}
	return string(b)
}

func wantGet(t *testing.T, s *msub, key, name, ns, ukey, want string, present bool) {
	t.Helper()
	got, ok := s.get(key, name, ns, ukey)
	if ok != present || got != want {
		t.Errorf("get(%q, %q, %q, %q) = %q, %v; want %q, %v", key, name, ns, ukey, got, ok, want, present)
	}
}

// --- scenarios ------------------------------------------------------------

func testMStateValuesMapsLists(t *testing.T, h *mharness) {
	s := h.startM(t, host.InstanceConfig{})
	k := "k"
	wantGet(t, s, k, "v", "", "", "", false)
	s.do(k, cmd('p', "v", "", "", "one"), cmd('p', "v", "", "", "two"))
	wantGet(t, s, k, "v", "", "", "two", true)
	wantGet(t, s, "other", "v", "", "", "", false)
	s.do(k, cmd('p', "v", "", "", "")) // an empty value is a value
	wantGet(t, s, k, "v", "", "", "", true)
	s.do(k, cmd('r', "v", "", ""))
	wantGet(t, s, k, "v", "", "", "", false)

	// A map: entries by user key, sorted by bytes.
	s.do(k, cmd('p', "m", "", "b", "2"), cmd('p', "m", "", "a", "1"), cmd('p', "m", "", "c\x00", "3"), cmd('p', "m", "", "", "e"))
	if got, want := s.entries(k, "m", ""), "=e a=1 b=2 c\x00=3"; got != want {
		t.Errorf("entries = %q, want %q", got, want)
	}
	s.do(k, cmd('r', "m", "", "b"), cmd('r', "m", "", "zz"))
	if got, want := s.entries(k, "m", ""), "=e a=1 c\x00=3"; got != want {
		t.Errorf("entries after remove = %q, want %q", got, want)
	}
	if got := s.entries(k, "none", ""); got != "" {
		t.Errorf("entries of an empty state = %q", got)
	}

	// A list: append in order; get returns a list frame.
	s.do(k, cmd('a', "l", "", "", "x"), cmd('a', "l", "", "", "yy"), cmd('a', "l", "", "", ""))
	got, _ := s.get(k, "l", "", "")
	if list(t, got) != "[x yy ]" {
		t.Errorf("list = %s, want [x yy ]", list(t, got))
	}
	s.do(k, cmd('a', "m", "", "lst", "e1"))
	if got, want := s.entries(k, "m", ""), "=e a=1 c\x00=3 lst="+listFrame("e1"); got != want {
		t.Errorf("entries with a list = %q, want %q", got, want)
	}
	// put over a list replaces it by a value
	s.do(k, cmd('p', "l", "", "", "val"))
	wantGet(t, s, k, "l", "", "", "val", true)

	// A value larger than the guest's first buffer: the guest retries.
	big := strings.Repeat("0123456789", 300)
	s.do(k, cmd('p', "big", "", "", big))
	wantGet(t, s, k, "big", "", "", big, true)
	if got := s.entries(k, "big", ""); got != "="+big {
		t.Errorf("entries of the big value: %d bytes, want %d", len(got), len(big)+1)
	}

	// append to a value fails the subtask
	err := s.inst.Process(context.Background(), 0, []abi.Record{rec(k, cmd('a', "v2", "", "", "x"), 0), rec(k, cmd('a', "l", "", "", "x"), 0)}, s.emit)
	he := checkError(t, err, host.ErrHostCall, "mstate", 0, 1, abi.PhaseProcess)
	if he != nil && !strings.Contains(he.Message, "state l: entry is a value, not a list") {
		t.Errorf("message %q, want it to say the entry is a value", he.Message)
	}
}

func testMStateNamespaces(t *testing.T, h *mharness) {
	s := h.startM(t, host.InstanceConfig{})
	k := "k"
	for _, ns := range []string{"", "w1", "w2", "w1\x00"} {
		s.do(k, cmd('p', "m", ns, "a", "a@"+ns), cmd('p', "m", ns, "b", "b@"+ns), cmd('a', "m", ns, "l", ns))
	}
	s.do("k2", cmd('p', "m", "w1", "a", "other key"))
	if got, want := s.entries(k, "m", "w1"), "a=a@w1 b=b@w1 l="+listFrame("w1"); got != want {
		t.Errorf("entries(w1) = %q, want %q", got, want)
	}
	s.do(k, cmd('c', "m", "w1"))
	if got := s.entries(k, "m", "w1"); got != "" {
		t.Errorf("entries(w1) after clear = %q", got)
	}
	wantGet(t, s, k, "m", "w1", "a", "", false)
	for _, ns := range []string{"", "w2", "w1\x00"} {
		if got, want := s.entries(k, "m", ns), fmt.Sprintf("a=a@%s b=b@%s l=%s", ns, ns, listFrame(ns)); got != want {
			t.Errorf("entries(%q) after clearing w1 = %q, want %q", ns, got, want)
		}
	}
	wantGet(t, s, "k2", "m", "w1", "a", "other key", true)
	s.do(k, cmd('c', "m", "nothing"))
	// A structured state and an old one of the same name do not meet.
	s.do(k, cmd('o', "m", "old"))
	wantGet(t, s, k, "m", "", "a", "a@", true)
}

func testMStateTTL(t *testing.T, h *mharness) {
	// The guest sets state_ttl("ttl", 100ms) and ("ttlr", 100ms, update on read) in open.
	s := h.startM(t, host.InstanceConfig{})
	k := "k"
	s.do(k, cmd('p', "ttl", "", "", "v"), cmd('p', "ttlr", "", "", "r"), cmd('p', "plain", "", "", "p"),
		cmd('p', "ttl", "ns", "u1", "m1"))
	h.clock.add(99)
	wantGet(t, s, k, "ttl", "", "", "v", true)
	wantGet(t, s, k, "ttlr", "", "", "r", true) // read at +99: expires at +199
	h.clock.add(1)                              // +100
	wantGet(t, s, k, "ttl", "", "", "", false)
	if got := s.entries(k, "ttl", "ns"); got != "" {
		t.Errorf("entries of expired entries = %q", got)
	}
	wantGet(t, s, k, "ttlr", "", "", "r", true) // refreshed: expires at +200
	h.clock.add(99)                             // +199
	wantGet(t, s, k, "ttlr", "", "", "r", true)
	h.clock.add(100) // +299
	wantGet(t, s, k, "ttlr", "", "", "", false)
	wantGet(t, s, k, "plain", "", "", "p", true)

	// A write renews the expiry; list elements expire one by one.
	s.do(k, cmd('p', "ttl", "", "", "v2"), cmd('a', "ttl", "", "l", "e1"))
	h.clock.add(60)
	s.do(k, cmd('p', "ttl", "", "", "v3"), cmd('a', "ttl", "", "l", "e2"))
	h.clock.add(60) // v3 written 60 ago; e1 120 ago, e2 60 ago
	wantGet(t, s, k, "ttl", "", "", "v3", true)
	got, ok := s.get(k, "ttl", "", "l")
	if !ok || list(t, got) != "[e2]" {
		t.Errorf("list after e1 expired = %q, %v; want [e2]", got, ok)
	}
	if got, want := s.entries(k, "ttl", ""), "=v3 l="+listFrame("e2"); got != want {
		t.Errorf("entries = %q, want %q", got, want)
	}
	h.clock.add(40)
	if got := s.entries(k, "ttl", ""); got != "" {
		t.Errorf("entries after all expired = %q", got)
	}
	// An expired value is absent for append: a new list starts.
	s.do(k, cmd('p', "ttl", "", "x", "v"))
	h.clock.add(100)
	s.do(k, cmd('a', "ttl", "", "x", "e"))
	if got, _ := s.get(k, "ttl", "", "x"); list(t, got) != "[e]" {
		t.Errorf("append over an expired value: %q", got)
	}
}

// structured returns the stored structured entries of a snapshot: stored
// name (without NUL) -> stored key -> value.
func structured(snap *host.Snapshot) map[string]int {
	out := map[string]int{}
	for _, g := range snap.KeyGroups {
		for name, m := range g.Entries {
			if strings.HasPrefix(name, "\x00") {
				out[name[1:]] += len(m)
			}
		}
	}
	return out
}

func testMStateTTLSnapshot(t *testing.T, h *mharness) {
	s := h.startM(t, host.InstanceConfig{})
	for n := range 10 {
		k := fmt.Sprintf("k%d", n)
		s.do(k, cmd('p', "ttl", "", "a", "v"), cmd('a', "ttl", "", "l", "e1"), cmd('p', "plain", "", "", "p"))
	}
	h.clock.add(50)
	s.do("k0", cmd('a', "ttl", "", "l", "e2"))
	h.clock.add(60) // all "ttl" entries expired but k0's e2
	snap := s.snapshot(1)
	got := structured(snap)
	if got["ttl"] != 1 || got["plain"] != 10 {
		t.Errorf("snapshot holds %v structured entries, want ttl 1 (k0's list) and plain 10", got)
	}
	kg := abi.KeyGroup([]byte("k0"), abi.DefaultMaxParallelism)
	for k, v := range snap.KeyGroups[kg].Entries["\x00ttl"] {
		if !strings.HasSuffix(k, "l") || !strings.HasSuffix(string(v), "e2") || strings.Contains(string(v), "e1") {
			t.Errorf("k0's list in the snapshot: %q = %q, want the element e2 alone", k, v)
		}
	}
	// Restored without the expired entries, with the expiry kept.
	r := h.startM(t, host.InstanceConfig{Restore: snap})
	wantGet(t, r, "k1", "ttl", "", "a", "", false)
	if got, _ := r.get("k0", "ttl", "", "l"); list(t, got) != "[e2]" {
		t.Errorf("restored list = %q", got)
	}
	h.clock.add(50)
	wantGet(t, r, "k0", "ttl", "", "l", "", false)
	wantGet(t, r, "k3", "plain", "", "", "p", true)
}

// checkpoint takes checkpoint id of s as the harness's backend does:
// full, or (pebble incremental) as files copied to a store directory.
func (h *mharness) checkpoint(t *testing.T, s *msub, id int64) *host.Snapshot {
	t.Helper()
	if !h.incremental {
		return s.snapshot(id)
	}
	snap, err := s.inst.SnapshotCheckpoint(context.Background(), id)
	if err != nil {
		t.Fatalf("checkpoint %d: %v", id, err)
	}
	if len(snap.Files) != 1 {
		t.Fatalf("incremental checkpoint %d has %d file parts, want 1", id, len(snap.Files))
	}
	store := t.TempDir()
	fs := *snap.Files[0]
	fs.Files = slices.Clone(fs.Files)
	for n, f := range fs.Files {
		if !f.Shared {
			continue
		}
		data, err := os.ReadFile(snap.Files[0].Path(f.Name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(store, f.Name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		fs.Files[n].Key, fs.Files[n].CRC32C = f.Name, crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
	}
	fs.Root = store
	fs.Fetch = func(_ context.Context, f host.StateFile, w io.Writer) error {
		r, err := os.Open(filepath.Join(store, f.Key))
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(w, r)
		return err
	}
	snap.Release()
	return &host.Snapshot{Files: []*host.FileState{&fs}, Lists: snap.Lists}
}

// redistribute gives each of p new subtasks the state of its key groups.
func redistribute(old []*host.Snapshot, p int) []*host.Snapshot {
	out := make([]*host.Snapshot, p)
	for i := range out {
		r := abi.RangeForSubtask(i, abi.DefaultMaxParallelism, p)
		part := &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}}
		for _, s := range old {
			for kg, g := range s.KeyGroups {
				if r.Contains(kg) {
					part.KeyGroups[kg] = g
				}
			}
			for _, f := range s.Files {
				if f.KeyGroups.Start <= r.End && f.KeyGroups.End >= r.Start {
					part.Files = append(part.Files, f)
				}
			}
		}
		out[i] = part
	}
	return out
}

func testMStateRescale(t *testing.T, h *mharness) {
	keys := make([]string, 12)
	for n := range keys {
		keys[n] = fmt.Sprintf("key-%d", n)
	}
	owner := func(k string, p int) int {
		kg := abi.KeyGroup([]byte(k), abi.DefaultMaxParallelism)
		for i := range p {
			if abi.RangeForSubtask(i, abi.DefaultMaxParallelism, p).Contains(kg) {
				return i
			}
		}
		panic("no owner")
	}
	start := func(p int, restore []*host.Snapshot) []*msub {
		subs := make([]*msub, p)
		for i := range subs {
			cfg := host.InstanceConfig{Subtask: i, Parallelism: p}
			if restore != nil {
				cfg.Restore = restore[i]
			}
			subs[i] = h.startM(t, cfg)
		}
		return subs
	}
	subs := start(2, nil)
	now := h.clock.millis()
	for n, k := range keys {
		s := subs[owner(k, 2)]
		s.do(k, cmd('p', "v", "", "", "v-"+k), cmd('p', "m", "ns", "a", k), cmd('p', "m", "ns", "b", k),
			cmd('a', "l", "w", "", "1"), cmd('a', "l", "w", "", "2"), cmd('p', "ttl", "", "", k),
			cmd('P', i64(now+int64(100+n))), cmd('P', i64(now+5000)))
	}
	check := func(subs []*msub, p int, what string) {
		t.Helper()
		for _, k := range keys {
			s := subs[owner(k, p)]
			wantGet(t, s, k, "v", "", "", "v-"+k, true)
			if got, want := s.entries(k, "m", "ns"), fmt.Sprintf("a=%s b=%s", k, k); got != want {
				t.Errorf("%s: entries of %s = %q, want %q", what, k, got, want)
			}
			if got, _ := s.get(k, "l", "w", ""); list(t, got) != "[1 2]" {
				t.Errorf("%s: list of %s = %q", what, k, got)
			}
		}
	}
	snapshots := func(subs []*msub, id int64) []*host.Snapshot {
		var out []*host.Snapshot
		for _, s := range subs {
			out = append(out, h.checkpoint(t, s, id))
		}
		return out
	}
	// 2 -> 3
	three := start(3, redistribute(snapshots(subs, 1), 3))
	check(three, 3, "2->3")
	// The processing-time timers moved with their keys: fire the early ones.
	h.clock.add(1000)
	for i, s := range three {
		if err := s.inst.FireProcessingTimers(context.Background(), h.clock.millis(), s.emit); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range s.take() {
			if owner(string(r.Key), 3) != i || string(r.Value[:2]) != "pt" {
				t.Errorf("subtask %d fired %q %q", i, r.Key, r.Value)
			}
			got = append(got, string(r.Key))
		}
		var want []string
		for n, k := range keys {
			if owner(k, 3) == i {
				_ = n
				want = append(want, k)
			}
		}
		// fired in ts order: now+100+n, n ascending = keys order
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("subtask %d of 3 fired %v, want %v", i, got, want)
		}
		if ts, ok := s.inst.NextProcessingTimer(); !ok || ts != now+5000 {
			t.Errorf("subtask %d of 3: next timer %d %v, want %d", i, ts, ok, now+5000)
		}
	}
	// 3 -> 1, and the expired "ttl" entries are gone by now.
	h.clock.add(5000)
	one := start(1, redistribute(snapshots(three, 2), 1))
	check(one, 1, "3->1")
	for _, k := range keys {
		wantGet(t, one[0], k, "ttl", "", "", "", false)
	}
	if err := one[0].inst.FireProcessingTimers(context.Background(), h.clock.millis(), one[0].emit); err != nil {
		t.Fatal(err)
	}
	var fired []string
	for _, r := range one[0].take() {
		fired = append(fired, string(r.Key))
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted) // same ts: key order
	if strings.Join(fired, ",") != strings.Join(sorted, ",") {
		t.Errorf("3->1: fired %v, want %v", fired, sorted)
	}
}

func testProcessingTimers(t *testing.T, h *mharness) {
	ctx := context.Background()
	s := h.startM(t, host.InstanceConfig{})
	if _, ok := s.inst.NextProcessingTimer(); ok {
		t.Fatal("a timer before any was registered")
	}
	s.do("b", cmd('P', i64(30)), cmd('P', i64(10)), cmd('P', i64(10)), cmd('P', i64(40)))
	s.do("a", cmd('P', i64(30)), cmd('P', i64(20)), cmd('D', i64(20)), cmd('D', i64(99)))
	if ts, ok := s.inst.NextProcessingTimer(); !ok || ts != 10 {
		t.Fatalf("next timer = %d, %v; want 10", ts, ok)
	}
	fire := func(now int64) string {
		t.Helper()
		if err := s.inst.FireProcessingTimers(ctx, now, s.emit); err != nil {
			t.Fatalf("fire at %d: %v", now, err)
		}
		var got []string
		for _, r := range s.take() {
			if string(r.Value[:2]) != "pt" || int64(binary.LittleEndian.Uint64(r.Value[2:])) != r.Timestamp {
				t.Fatalf("fired %q %q", r.Key, r.Value)
			}
			got = append(got, fmt.Sprintf("%s@%d", r.Key, r.Timestamp))
		}
		return strings.Join(got, " ")
	}
	if got := fire(9); got != "" {
		t.Errorf("fired at 9: %s", got)
	}
	if got, want := fire(30), "b@10 a@30 b@30"; got != want {
		t.Errorf("fired at 30: %q, want %q", got, want)
	}
	if got := fire(30); got != "" {
		t.Errorf("fired twice: %s", got)
	}
	// restored: the pending timer fires after the restore
	snap := h.checkpoint(t, s, 1)
	r := h.startM(t, host.InstanceConfig{Restore: snap})
	if ts, ok := r.inst.NextProcessingTimer(); !ok || ts != 40 {
		t.Fatalf("restored next timer = %d, %v; want 40", ts, ok)
	}
	s.sub = r.sub
	if got := fire(1000); got != "b@40" {
		t.Errorf("restored fired %q, want b@40", got)
	}
	// none fire after finish; pending ones are dropped
	s.do("c", cmd('P', i64(2000)))
	s.finish()
	if _, ok := s.inst.NextProcessingTimer(); ok {
		t.Error("a next timer after finish")
	}
	if got := fire(5000); got != "" {
		t.Errorf("fired after finish: %s", got)
	}
}

func testProcessingTimeClock(t *testing.T, h *mharness) {
	s := h.startM(t, host.InstanceConfig{AllowClock: true})
	s.do("k", cmd('n'))
	out := s.take()
	if len(out) != 1 || len(out[0].Value) != 9 || int64(binary.LittleEndian.Uint64(out[0].Value[1:])) != h.clock.millis() {
		t.Fatalf("processing_time emitted %s, want the clock %d", show(out), h.clock.millis())
	}
	d := h.startM(t, host.InstanceConfig{})
	err := d.inst.Process(context.Background(), 0, []abi.Record{rec("k", cmd('n'), 0)}, d.emit)
	he := checkError(t, err, host.ErrHostCall, "mstate", 0, 1, abi.PhaseProcess)
	if he != nil && he.Message != "processing_time needs allow_clock: true (job file)" {
		t.Errorf("message %q", he.Message)
	}
}

func testOldNulName(t *testing.T, h *mharness) {
	s := h.startM(t, host.InstanceConfig{})
	err := s.inst.Process(context.Background(), 0, []abi.Record{rec("k", cmd('o', "\x00m", "v"), 0)}, s.emit)
	he := checkError(t, err, host.ErrHostCall, "mstate", 0, 1, abi.PhaseProcess)
	if he != nil && !strings.Contains(he.Message, "starts with a NUL byte") {
		t.Errorf("message %q, want it to say the name starts with NUL", he.Message)
	}
}

func testMStateUndo(t *testing.T, h *mharness) {
	ctx := context.Background()
	s := h.startM(t, host.InstanceConfig{Isolate: true})
	k := "k"
	s.do(k, cmd('p', "m", "", "a", "1"), cmd('a', "l", "", "", "x"), cmd('p', "c", "w", "u", "keep"), cmd('p', "ttlr", "", "", "r"))
	h.clock.add(50)
	err := s.inst.Process(ctx, 0, []abi.Record{
		rec(k, cmd('p', "m", "", "a", "2"), 0), rec(k, cmd('p', "m", "", "b", "new"), 0),
		rec(k, cmd('a', "l", "", "", "y"), 0), rec(k, cmd('c', "c", "w"), 0), rec(k, cmd('r', "m", "", "zz"), 0),
		rec(k, cmd('P', i64(10)), 0), rec(k, cmd('g', "ttlr", "", ""), 0), rec(k, cmd('x'), 0),
	}, s.emit)
	if !errors.Is(err, host.ErrRejected) {
		t.Fatalf("process: %v, want a rejection", err)
	}
	s.replace()
	if got, want := s.entries(k, "m", ""), "a=1"; got != want {
		t.Errorf("map after the undone batch = %q, want %q", got, want)
	}
	if got, _ := s.get(k, "l", "", ""); list(t, got) != "[x]" {
		t.Errorf("list after the undone batch = %s", list(t, got))
	}
	wantGet(t, s, k, "c", "w", "u", "keep", true)
	if _, ok := s.inst.NextProcessingTimer(); ok {
		t.Error("the undone batch's processing-time timer is there")
	}
	// The undone read did not refresh the expiry: written at 0, gone at 100.
	h.clock.add(50)
	wantGet(t, s, k, "ttlr", "", "", "", false)
}

func testTTLOnlyInOpen(t *testing.T, h *mharness) {
	s := h.startM(t, host.InstanceConfig{})
	err := s.inst.Process(context.Background(), 0, []abi.Record{rec("k", cmd('t', "m", i64(5)), 0)}, s.emit)
	he := checkError(t, err, host.ErrHostCall, "mstate", 0, 1, abi.PhaseProcess)
	if he != nil && he.Message != "state_ttl not allowed in phase process (only in open)" {
		t.Errorf("message %q", he.Message)
	}
}
