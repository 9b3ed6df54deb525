package checkpoint

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

// bigState is a keyed state generated on the fly, never held in memory:
// key i is "key-%08d"; every key has a "count" value, every third a "sum"
// value too, every tenth an event-time timer and every 17th a
// processing-time timer (a version 2 snapshot).
type bigState struct {
	maxP int
	byKG [][]int32 // key indices by key group, ascending
}

const bigValueSize = 200

func newBigState(maxP int, mib int) *bigState {
	n := mib << 20 / (8 + 12 + bigValueSize + (8+12+bigValueSize)/3)
	b := &bigState{maxP: maxP, byKG: make([][]int32, maxP)}
	var buf []byte
	for i := range n {
		buf = b.key(buf[:0], i)
		kg := abi.KeyGroup(buf, maxP)
		b.byKG[kg] = append(b.byKG[kg], int32(i))
	}
	return b
}

func (b *bigState) key(dst []byte, i int) []byte { return fmt.Appendf(dst, "key-%08d", i) }

// val is the value of key i in state name.
func (b *bigState) val(dst []byte, i int, name string) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(i))
	for len(dst) < bigValueSize {
		dst = append(dst, name[0]+byte(i+len(dst)))
	}
	return dst
}

type bigTimer struct {
	ts int64
	i  int
}

// timers are the timers of key group kg in (ts, key) order.
func (b *bigState) timers(kg int, proc bool) []bigTimer {
	var out []bigTimer
	for _, i := range b.byKG[kg] {
		switch {
		case !proc && i%10 == 0:
			out = append(out, bigTimer{ts: int64(i % 1000), i: int(i)})
		case proc && i%17 == 0:
			out = append(out, bigTimer{ts: 1_700_000_000_000 + int64(i%5000), i: int(i)})
		}
	}
	slices.SortFunc(out, func(a, c bigTimer) int {
		if x := cmp.Compare(a.ts, c.ts); x != 0 {
			return x
		}
		return cmp.Compare(a.i, c.i) // keys of equal length sort by number
	})
	return out
}

// entries calls fn for the entries of key group kg in the snapshot's order.
func (b *bigState) entries(kg int, fn func(name string, i int)) {
	for _, name := range []string{"count", "sum"} {
		for _, i := range b.byKG[kg] {
			if name == "count" || i%3 == 0 {
				fn(name, int(i))
			}
		}
	}
}

// writeSnapshot writes the snapshot (host format, version 2) of the key
// groups in rng, with a union list "total" of one entry.
func (b *bigState) writeSnapshot(w io.Writer, rng abi.KeyGroupRange) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	out := io.MultiWriter(bw, h)
	le := binary.LittleEndian
	var s, kb, vb []byte
	u32 := func(v uint32) { s = le.AppendUint32(s, v) }
	bs := func(p []byte) { u32(uint32(len(p))); s = append(s, p...) }
	flush := func() { out.Write(s); s = s[:0] }
	s = append(s, "SDSS"...)
	u32(2)
	u32(uint32(rng.End - rng.Start + 1))
	for kg := rng.Start; kg <= rng.End; kg++ {
		u32(uint32(kg))
		u32(2)
		for _, name := range []string{"count", "sum"} {
			bs([]byte(name))
			n := 0
			for _, i := range b.byKG[kg] {
				if name == "count" || i%3 == 0 {
					n++
				}
			}
			u32(uint32(n))
			for _, i := range b.byKG[kg] {
				if name == "count" || i%3 == 0 {
					kb, vb = b.key(kb[:0], int(i)), b.val(vb[:0], int(i), name)
					bs(kb)
					bs(vb)
					flush()
				}
			}
		}
		for _, proc := range []bool{false, true} {
			ts := b.timers(kg, proc)
			u32(uint32(len(ts)))
			for _, t := range ts {
				bs(b.key(kb[:0], t.i))
				s = le.AppendUint64(s, uint64(t.ts))
			}
			flush()
		}
	}
	u32(1)
	bs([]byte("total"))
	u32(uint32(abi.ListUnion))
	u32(1)
	bs(le.AppendUint64(nil, 5))
	flush()
	if _, err := bw.Write(le.AppendUint32(nil, h.Sum32())); err != nil {
		return err
	}
	return bw.Flush()
}

// writeBlob writes the state blob of the snapshot of rng to w: a version 1
// blob of one section.
func (b *bigState) writeBlob(w io.Writer, rng abi.KeyGroupRange) error {
	var n countingWriter
	if err := b.writeSnapshot(&n, rng); err != nil {
		return err
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	out := io.MultiWriter(w, h)
	le := binary.LittleEndian
	hdr := le.AppendUint32(le.AppendUint32([]byte("SDST"), 1), 1)
	hdr = le.AppendUint64(append(hdr, 1), uint64(n))
	if _, err := out.Write(hdr); err != nil {
		return err
	}
	if err := b.writeSnapshot(out, rng); err != nil {
		return err
	}
	_, err := w.Write(le.AppendUint32(nil, h.Sum32()))
	return err
}

type countingWriter int64

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}

// checkWriter compares what a decoder reads with the generated state.
type checkWriter struct {
	b       *bigState
	kg      int
	want    []func(w *checkWriter, kind string, name, key, val []byte, ts int64) error
	kb, vb  []byte
	entries int
}

func (c *checkWriter) begin(kg int) {
	c.kg, c.want = kg, c.want[:0]
	c.b.entries(kg, func(name string, i int) {
		c.want = append(c.want, func(w *checkWriter, kind string, gname, key, val []byte, _ int64) error {
			w.kb, w.vb = w.b.key(w.kb[:0], i), w.b.val(w.vb[:0], i, name)
			if kind != "entry" || string(gname) != name || !bytes.Equal(key, w.kb) || !bytes.Equal(val, w.vb) {
				return fmt.Errorf("key group %d: got %s %q %q, want entry %s %q", kg, kind, gname, key, name, w.kb)
			}
			return nil
		})
	})
	for _, proc := range []bool{false, true} {
		kind := map[bool]string{false: "timer", true: "ptimer"}[proc]
		for _, t := range c.b.timers(kg, proc) {
			c.want = append(c.want, func(w *checkWriter, gkind string, _, key, _ []byte, ts int64) error {
				w.kb = w.b.key(w.kb[:0], t.i)
				if gkind != kind || !bytes.Equal(key, w.kb) || ts != t.ts {
					return fmt.Errorf("key group %d: got %s %q@%d, want %s %q@%d", kg, gkind, key, ts, kind, w.kb, t.ts)
				}
				return nil
			})
		}
	}
	slices.Reverse(c.want)
}

func (c *checkWriter) next(kind string, kg int, name, key, val []byte, ts int64) error {
	if kg != c.kg || len(c.want) == 0 {
		return fmt.Errorf("key group %d: unexpected %s %q %q", kg, kind, name, key)
	}
	f := c.want[len(c.want)-1]
	c.want = c.want[:len(c.want)-1]
	c.entries++
	return f(c, kind, name, key, val, ts)
}

func (c *checkWriter) Entry(kg int, name, key, val []byte) error {
	return c.next("entry", kg, name, key, val, 0)
}

func (c *checkWriter) Timer(kg int, key []byte, ts int64, proc bool) error {
	return c.next(map[bool]string{false: "timer", true: "ptimer"}[proc], kg, nil, key, nil, ts)
}

// heapPeak samples HeapInuse until stop and returns its peak above the
// level at the start.
func heapPeak() (stop func() uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > base && ms.HeapInuse-base > peak.Load() {
				peak.Store(ms.HeapInuse - base)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(done); wg.Wait(); return peak.Load() }
}

// resetPeakRSS starts a new peak of the resident set (Linux; false
// elsewhere), which peakRSS reads.
func resetPeakRSS() bool { return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil }

// peakRSS is the peak resident set size since resetPeakRSS (VmHWM).
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// A full savepoint of a state larger than what the restore may hold in
// memory (128 MiB by default; STREAMD_TEST_RESTORE_MIB sets it) restores
// into pebble at another parallelism (2 -> 3): LoadRestoreFrom keeps the
// keyed state in the blobs, each new subtask decodes its key groups as it
// reads them, and the Go heap grows by far less than the state (pebble's
// memtables and block cache are outside it, and bounded). Every entry and
// timer is checked by streaming a snapshot of each restored instance. Then
// a blob that changed after LoadRestoreFrom (a flipped byte, a truncation)
// fails the restore, naming the blob, and leaves no database files.
func TestRestoreLargeSavepointIntoPebble(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and restores a large savepoint")
	}
	mib := 128
	if s := os.Getenv("STREAMD_TEST_RESTORE_MIB"); s != "" {
		var err error
		if mib, err = strconv.Atoi(s); err != nil || mib < 1 {
			t.Fatalf("STREAMD_TEST_RESTORE_MIB=%q", s)
		}
	}
	ctx := context.Background()
	const maxP = abi.DefaultMaxParallelism
	big := newBigState(maxP, mib)
	d := openDir(t)
	var acks []control.AckedState
	for j := range 2 {
		sub := control.SubtaskID{Operator: "count", Index: j}
		rng := abi.RangeForSubtask(j, maxP, 2)
		ref, err := d.WriteStateFrom(ctx, control.KindSavepoint, 1, sub, func(w io.Writer) error { return big.writeBlob(w, rng) })
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, control.AckedState{Subtask: sub, StateRef: ref.String(), Size: ref.Size})
	}
	md, err := NewMetadata(testGraph(t, 1, 2, 1), control.PersistMetadata{ID: 1, Kind: control.KindSavepoint, Acks: acks}, rng2time())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(ctx, md); err != nil {
		t.Fatal(err)
	}
	state := md.StateSize()
	t.Logf("savepoint: %d MiB of state in 2 blobs", state>>20)

	debug.SetGCPercent(50) // less garbage between collections: a tighter measure
	defer debug.SetGCPercent(100)
	g := testGraph(t, 1, 3, 1)
	stop := heapPeak()
	rs, err := LoadRestoreFrom(ctx, d, md, g)
	peak := stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("LoadRestoreFrom: heap peak +%d KiB", peak>>10)
	if peak > 16<<20 {
		t.Errorf("LoadRestoreFrom grew the heap by %d MiB for %d MiB of state", peak>>20, state>>20)
	}

	eng, err := host.NewEngine(ctx, host.WithCacheDir(""))
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(ctx)
	mod, err := eng.LoadFile(ctx, testwasm.Path(t, "internal/conformance/guests/wat/conformance.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	cache := host.NewStateCache(8 << 20)
	defer cache.Release()
	data := t.TempDir()
	newInstance := func(i int) (*host.Instance, error) {
		sr := rs.Subtasks[control.SubtaskID{Operator: "count", Index: i}]
		if sr == nil || sr.Snapshot == nil || len(sr.Snapshot.Sources) == 0 || len(sr.Snapshot.KeyGroups) != 0 {
			t.Fatalf("subtask %d restores %+v, want its keyed state as sources", i, sr)
		}
		return mod.NewInstance(ctx, host.InstanceConfig{Job: "job", Operator: "count", Subtask: i, Parallelism: 3, MaxParallelism: maxP,
			Restore: sr.Snapshot, State: host.StateConfig{Backend: host.BackendPebble, DataDir: data, Cache: cache}})
	}
	left := func() []string {
		ents, _ := os.ReadDir(data)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	total := 0
	for i := range 3 {
		start := time.Now()
		stop := heapPeak()
		rss := resetPeakRSS()
		inst, err := newInstance(i)
		peak := stop()
		if err != nil {
			t.Fatal(err)
		}
		if rss {
			t.Logf("subtask %d/3: restored in %v, heap peak +%d MiB, peak RSS %d MiB", i, time.Since(start).Round(time.Millisecond), peak>>20, peakRSS()>>20)
		} else {
			t.Logf("subtask %d/3: restored in %v, heap peak +%d MiB", i, time.Since(start).Round(time.Millisecond), peak>>20)
		}
		if peak > 48<<20 {
			t.Errorf("restoring subtask %d grew the heap by %d MiB (its part of the state: about %d MiB)", i, peak>>20, state/3>>20)
		}
		if err := inst.Open(ctx); err != nil {
			t.Fatal(err)
		}
		snap, err := inst.SnapshotState(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !snap.Streamable() {
			t.Fatal("the pebble snapshot is not streamable")
		}
		pr, pw := io.Pipe()
		var size int64
		sized := make(chan struct{})
		go func() {
			pw.CloseWithError(snap.EncodeTo(pw, func(n int64) error { size = n; close(sized); return nil }))
		}()
		// EncodeTo sizes the snapshot before it writes the first byte.
		br := bufio.NewReader(pr)
		if _, err := br.Peek(1); err != nil {
			t.Fatal(err)
		}
		<-sized
		dec, err := host.NewSnapshotDecoder(br, size)
		if err != nil {
			t.Fatal(err)
		}
		cw := &checkWriter{b: big}
		rng := abi.RangeForSubtask(i, maxP, 3)
		kg := rng.Start
		for ; ; kg++ {
			got, ok, err := dec.Next()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if got != kg {
				t.Fatalf("subtask %d: key group %d, want %d", i, got, kg)
			}
			cw.begin(kg)
			if err := dec.Read(cw); err != nil {
				t.Fatalf("subtask %d: %v", i, err)
			}
			if len(cw.want) > 0 {
				t.Fatalf("subtask %d: key group %d lacks %d entries and timers", i, kg, len(cw.want))
			}
		}
		if kg != rng.End+1 {
			t.Fatalf("subtask %d: key groups up to %d, want %s", i, kg-1, rng)
		}
		if _, err := dec.Finish(); err != nil {
			t.Fatal(err)
		}
		pr.Close()
		total += cw.entries
		if err := inst.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := 0
	for kg := range maxP {
		big.entries(kg, func(string, int) { want++ })
		want += len(big.timers(kg, false)) + len(big.timers(kg, true))
	}
	if total != want {
		t.Fatalf("restored %d entries and timers, want %d", total, want)
	}
	if l := left(); len(l) != 0 {
		t.Fatalf("closed instances left %v in the data directory", l)
	}

	// The blob changes after LoadRestoreFrom read it: the restore that
	// reads it fails, naming it, and the discarded instance leaves nothing.
	blob := filepath.Join(md.Location, blobName(control.SubtaskID{Operator: "count", Index: 1}))
	orig, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	flipped := slices.Clone(orig)
	flipped[len(flipped)*2/3] ^= 0x10 // deep in the keyed state: written before the checksum fails
	lengthFlip := slices.Clone(orig)
	lengthFlip[12+9+12+4+4+4+5] ^= 0x40 // the entry count of the first state: a format error at once
	for name, c := range map[string]struct {
		data []byte
		msg  string
	}{
		"flipped":        {flipped, "checksum mismatch"},
		"flipped-length": {lengthFlip, "checksum mismatch"},
		"truncated":      {orig[:len(orig)/2], "truncated"},
	} {
		if err := os.WriteFile(blob, c.data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := newInstance(1)
		wantErr(t, err, nil, blob, c.msg)
		if l := left(); len(l) != 0 {
			t.Fatalf("%s: the failed restore left %v in the data directory", name, l)
		}
		_, err = LoadRestoreFrom(ctx, d, md, g)
		wantErr(t, err, ErrCorrupt, blob, c.msg)
	}
}
