package host

import (
	"fmt"
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

// TestPebbleRowCacheWriteThrough: reads through the row cache see every
// put and delete, and a restore replaces what the cache knew.
func TestPebbleRowCacheWriteThrough(t *testing.T) {
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
	s.rows.clear() // the DB has it too
	want("22", true)
	if err := s.del(kg, name, key); err != nil {
		t.Fatal(err)
	}
	want("", false)
	s.rows.clear()
	want("", false)
	if err := s.restore(map[int]*KeyGroupState{kg: {Entries: map[string]map[string][]byte{"count": {"k": []byte("333")}}}}); err != nil {
		t.Fatal(err)
	}
	want("333", true)
}
