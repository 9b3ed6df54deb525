package host

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/streamd/streamd/abi"
)

// backendIn makes a backend of the key groups rng, closed at cleanup.
func backendIn(t *testing.T, backend string, maxP int, rng abi.KeyGroupRange, dir string) stateBackend {
	t.Helper()
	cfg := InstanceConfig{MaxParallelism: maxP, State: StateConfig{Backend: backend, DataDir: dir, Incremental: true}}
	s, err := newBackend(cfg, rng, testNow, pebbleOptions{logger: discardLogger, name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return s
}

// storeCut "uploads" the shared files of a file cut into store (a
// directory) under their names and sets Key, CRC32C, Root and Fetch as a
// checkpoint store does; then it releases the cut.
func storeCut(t *testing.T, snap *Snapshot, store string) *FileState {
	t.Helper()
	if len(snap.Files) != 1 {
		t.Fatalf("file cut has %d parts", len(snap.Files))
	}
	fs := *snap.Files[0]
	fs.Files = append([]StateFile(nil), fs.Files...)
	for i, f := range fs.Files {
		if !f.Shared {
			continue
		}
		data, err := os.ReadFile(snap.Files[0].Path(f.Name))
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("%s-%s", filepath.Base(snap.Files[0].dir), f.Name)
		if err := os.WriteFile(filepath.Join(store, key), data, 0o644); err != nil {
			t.Fatal(err)
		}
		fs.Files[i].Key, fs.Files[i].CRC32C = key, crc32.Checksum(data, castagnoliTable)
	}
	fs.dir, fs.Root = "", store
	fs.Fetch = func(_ context.Context, f StateFile, w io.Writer) error {
		r, err := os.Open(filepath.Join(store, f.Key))
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(w, r)
		return err
	}
	snap.Release()
	if _, err := os.Stat(snap.Files[0].dir); snap.Files[0].dir != "" || err == nil {
		t.Fatalf("the cut's directory %q is still there after Release", snap.Files[0].dir)
	}
	return &fs
}

// dump reads a backend's state and timers through a full cut.
func dump(t *testing.T, s stateBackend) map[int]*KeyGroupState {
	t.Helper()
	snap, err := s.cut()
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Load(); err != nil {
		t.Fatal(err)
	}
	out := snap.KeyGroups
	if out == nil {
		out = map[int]*KeyGroupState{}
	}
	for _, g := range out { // a cut of the memory backend holds them in any order
		sortTimers(g.Timers)
		sortTimers(g.ProcTimers)
	}
	return out
}

// TestFileCutRestoreRescale: the keyed state and timers cut as files
// restore into both backends at the same parallelism (the pebble backend
// opens the files as they are), scaled out (each new subtask clips the
// files it adopts to its key groups) and scaled in (one part adopted, the
// other copied), equal to the state written, nothing more.
func TestFileCutRestoreRescale(t *testing.T) {
	const maxP = 16
	data, store := t.TempDir(), t.TempDir()
	halves := []abi.KeyGroupRange{{Start: 0, End: 7}, {Start: 8, End: 15}}
	all := abi.KeyGroupRange{Start: 0, End: 15}
	want := map[int]*KeyGroupState{}
	var parts []*FileState
	for _, rng := range halves {
		s := backendIn(t, BackendPebble, maxP, rng, data)
		for i := 0; i < 3000; i++ {
			key := []byte(fmt.Sprintf("key-%d", i))
			kg := abi.KeyGroup(key, maxP)
			if !rng.Contains(kg) {
				continue
			}
			g := groupIn(want, kg)
			for _, name := range []string{"count", "sum"} {
				val := fmt.Sprintf("%s=%d", name, i)
				if g.Entries[name] == nil {
					g.Entries[name] = map[string][]byte{}
				}
				g.Entries[name][string(key)] = []byte(val)
				if err := s.put(kg, []byte(name), key, []byte(val)); err != nil {
					t.Fatal(err)
				}
			}
			if i%10 == 0 {
				g.Timers = append(g.Timers, Timer{Key: key, TS: int64(i)})
				if err := s.registerTimer(eventTime, key, int64(i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		snap, err := s.(fileCutter).fileCut()
		if err != nil {
			t.Fatal(err)
		}
		// Later writes are not in the cut.
		if err := s.put(rng.Start, []byte("count"), []byte("later"), []byte("x")); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, storeCut(t, snap, store))
	}
	for kg, g := range want {
		sortTimers(g.Timers)
		want[kg] = g
	}
	in := func(rng abi.KeyGroupRange) map[int]*KeyGroupState {
		out := map[int]*KeyGroupState{}
		for kg, g := range want {
			if rng.Contains(kg) {
				out[kg] = g
			}
		}
		return out
	}
	cases := []struct {
		name  string
		rng   abi.KeyGroupRange
		parts []*FileState
	}{
		{"same", halves[1], parts[1:]},
		{"scale-out", abi.KeyGroupRange{Start: 4, End: 11}, parts},
		{"scale-in", all, parts},
	}
	for _, backend := range backends {
		for _, c := range cases {
			t.Run(backend+"/"+c.name, func(t *testing.T) {
				s := backendIn(t, backend, maxP, c.rng, data)
				var err error
				if fi, ok := s.(fileImporter); ok {
					err = fi.importFiles(context.Background(), c.parts)
				} else {
					err = importParts(context.Background(), c.parts, data, c.rng, maxP, s.put, s.registerTimer)
				}
				if err != nil {
					t.Fatal(err)
				}
				got := dump(t, s)
				if w := in(c.rng); !reflect.DeepEqual(got, w) {
					t.Fatalf("restored %d key groups %v, want %d %v", len(got), keysOf(got), len(w), keysOf(w))
				}
				if p, ok := s.(*pebbleState); ok && p.adopted == nil {
					t.Fatal("the pebble backend copied every part instead of opening one")
				}
			})
		}
	}
}

func keysOf(m map[int]*KeyGroupState) []int {
	return slices.Sorted(maps.Keys(m))
}
