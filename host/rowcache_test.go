package host

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
)

// TestRowCacheBound: the cache never holds more than its bound, evicts down
// to three quarters of it, and answers what it holds: values, absent keys,
// and nothing once dropped or cleared.
func TestRowCacheBound(t *testing.T) {
	c := newRowCache(64 * (rowOverhead + 16))
	for i := range 1000 {
		c.set([]byte(fmt.Sprintf("key-%04d", i)), []byte(fmt.Sprintf("val-%04d", i)), false)
		if c.bytes > c.max {
			t.Fatalf("after %d sets: %d bytes, bound %d", i+1, c.bytes, c.max)
		}
	}
	total := 0
	for k, e := range c.m {
		total += len(k) + len(e.v) + rowOverhead
		if v, ok, known := c.get([]byte(k)); !known || !ok || string(v) != "val-"+k[4:] {
			t.Fatalf("get %s: %q %v %v", k, v, ok, known)
		}
	}
	if total != c.bytes || len(c.m) == 0 {
		t.Fatalf("%d entries of %d bytes, counted %d", len(c.m), total, c.bytes)
	}
	c.set([]byte("gone"), nil, true)
	if _, ok, known := c.get([]byte("gone")); !known || ok {
		t.Fatalf("absent key: ok %v known %v", ok, known)
	}
	c.set([]byte("gone"), []byte("back"), false)
	if v, ok, _ := c.get([]byte("gone")); !ok || string(v) != "back" {
		t.Fatalf("overwritten absent key: %q %v", v, ok)
	}
	c.drop([]byte("gone"))
	if _, _, known := c.get([]byte("gone")); known {
		t.Fatal("dropped key still known")
	}
	c.clear()
	if len(c.m) != 0 || c.bytes != 0 {
		t.Fatalf("cleared: %d entries, %d bytes", len(c.m), c.bytes)
	}
	c.set(make([]byte, c.max), nil, false)
	if len(c.m) != 0 {
		t.Fatal("an entry larger than the cache was kept")
	}
}

// TestPebbleRowCacheWriteBack: reads through the row cache see every put
// and delete, flushed or not, and a restore replaces what the cache knew.
func TestPebbleRowCacheWriteBack(t *testing.T) {
	s, err := openPebble(128, abi.KeyGroupRange{Start: 0, End: 127}, StateConfig{DataDir: t.TempDir()}, pebbleOptions{logger: discardLogger, name: "rowcache"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	name, key := []byte("count"), []byte("k")
	kg := abi.KeyGroup(key, 128)
	want := func(v string, ok bool) {
		t.Helper()
		got, found, err := s.get(kg, name, key)
		if err != nil || found != ok || string(got) != v {
			t.Fatalf("get: %q %v %v, want %q %v", got, found, err, v, ok)
		}
	}
	want("", false) // from the DB, then known absent
	want("", false)
	if err := s.put(kg, name, key, []byte("1")); err != nil {
		t.Fatal(err)
	}
	want("1", true)
	if err := s.put(kg, name, key, []byte("22")); err != nil {
		t.Fatal(err)
	}
	want("22", true)
	if err := s.flushRows(); err != nil {
		t.Fatal(err)
	}
	s.rows.clear() // the DB has it now
	want("22", true)
	if err := s.del(kg, name, key); err != nil {
		t.Fatal(err)
	}
	want("", false)
	if err := s.flushRows(); err != nil {
		t.Fatal(err)
	}
	s.rows.clear()
	want("", false)
	if err := s.restore(map[int]*KeyGroupState{kg: {Entries: map[string]map[string][]byte{"count": {"k": []byte("333")}}}}); err != nil {
		t.Fatal(err)
	}
	want("333", true)
}

// TestRowCacheKeepsDirty: eviction never drops a dirty entry, and a write
// that does not fit beside the dirty entries is refused (the backend
// flushes first).
func TestRowCacheKeepsDirty(t *testing.T) {
	c := newRowCache(16 * (rowOverhead + 16))
	refused := -1
	for i := range 100 {
		if !c.write([]byte(fmt.Sprintf("key-%04d", i)), []byte(fmt.Sprintf("val-%04d", i)), false) {
			refused = i
			break
		}
	}
	if refused < 0 {
		t.Fatal("every write fit in a cache of 16 entries")
	}
	if len(c.dirty) != refused || len(c.m) != refused {
		t.Fatalf("%d dirty, %d cached after %d writes", len(c.dirty), len(c.m), refused)
	}
	for i := range refused {
		k := fmt.Sprintf("key-%04d", i)
		if v, ok, known := c.get([]byte(k)); !known || !ok || string(v) != "val-"+k[4:] {
			t.Fatalf("dirty %s: %q %v %v", k, v, ok, known)
		}
	}
	c.set([]byte("key-0000"), []byte("stale"), false) // a DB read never overwrites a dirty entry
	if v, _, _ := c.get([]byte("key-0000")); string(v) != "val-0000" {
		t.Fatalf("dirty entry overwritten by a read: %q", v)
	}
	c.flushed()
	if !c.write([]byte("next"), []byte("v"), false) {
		t.Fatal("a write after the flush did not fit (clean entries are evictable)")
	}
}

// TestPebbleWriteBackFlushes: writes past the write-back bound, deletes
// and overwrites reach the DB, and every reader of the DB other than get
// (a cut, a scan) sees the writes not flushed yet.
func TestPebbleWriteBackFlushes(t *testing.T) {
	const maxP = 128
	s, err := openPebble(maxP, abi.KeyGroupRange{Start: 0, End: maxP - 1}, StateConfig{DataDir: t.TempDir()}, pebbleOptions{logger: discardLogger, name: "writeback"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	s.rows = newRowCache(256 << 10) // flushes every 64 KiB of writes
	name := []byte("count")
	want := map[string]string{}
	for round := range 3 {
		for i := range 5000 {
			k := fmt.Sprintf("key-%05d", i)
			kg := abi.KeyGroup([]byte(k), maxP)
			switch {
			case i%7 == round:
				if err := s.del(kg, name, []byte(k)); err != nil {
					t.Fatal(err)
				}
				delete(want, k)
			default:
				v := fmt.Sprintf("%d-%d", round, i)
				if err := s.put(kg, name, []byte(k), []byte(v)); err != nil {
					t.Fatal(err)
				}
				want[k] = v
			}
		}
		if len(s.rows.dirty) == 0 {
			t.Fatal("no write left dirty: the test does not test the flush before a cut")
		}
		snap, err := s.cut()
		if err != nil {
			t.Fatal(err)
		}
		if err := snap.Load(); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, g := range snap.KeyGroups {
			for k, v := range g.Entries[string(name)] {
				got[k] = string(v)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: the cut holds %d keys, want %d", round, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("round %d: the cut has %s=%q, want %q", round, k, got[k], v)
			}
		}
	}
	// Structured state is read by scan, from the DB: it sees unflushed writes.
	sname := []byte("\x00m")
	prefix := appendEntryPrefix(nil, []byte("k"), nil)
	kg := abi.KeyGroup([]byte("k"), maxP)
	for i := range 3 {
		if err := s.put(kg, sname, append(slices.Clone(prefix), byte('a'+i)), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	if err := s.scan(kg, sname, prefix, func(ukey, _ []byte) error { seen = append(seen, string(ukey)); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(seen, ",") != "a,b,c" {
		t.Fatalf("scan saw %q, want a,b,c", seen)
	}
}
