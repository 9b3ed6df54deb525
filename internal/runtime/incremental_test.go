package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/testwasm"
)

// crashStore is a directory store that "crashes" the run (cancels it, as a
// killed process stops) at one step of an incremental checkpoint: before
// the first shared-file upload of checkpoint id or later ("upload"), or
// after the uploads, instead of writing its metadata ("commit").
type crashStore struct {
	*checkpoint.Dir
	at    string
	id    int64
	crash context.CancelFunc
	once  sync.Once
	fired chan struct{}
}

var errCrash = errors.New("crashed (test)")

func (s *crashStore) fire() {
	s.once.Do(func() {
		s.crash()
		close(s.fired)
	})
}

func (s *crashStore) PutShared(ctx context.Context, key, path string) (int64, uint32, error) {
	id, _ := strconv.ParseInt(key[:strings.IndexByte(key, '-')], 10, 64)
	if s.at == "upload" && id >= s.id {
		s.fire()
		return 0, 0, errCrash
	}
	return s.Dir.PutShared(ctx, key, path)
}

func (s *crashStore) Commit(ctx context.Context, md *checkpoint.Metadata) error {
	if s.at == "commit" && md.ID >= s.id && md.Kind == control.KindCheckpoint {
		s.fire()
		return errCrash
	}
	return s.Dir.Commit(ctx, md)
}

// TestIncrementalCheckpointCrash: a keyed counter on the pebble backend
// with incremental checkpoints crashes at a step of a checkpoint (none:
// right after one completed; before a shared-file upload; after the uploads, before
// the metadata commit); a new run restores the latest completed checkpoint
// at another parallelism into pebble or memory and runs to the end. The
// file sink holds every count exactly once, later checkpoints referred to
// files uploaded by earlier ones, and the store's shared directory holds
// exactly the files its retained checkpoints refer to: none missing, none
// orphaned (the crashed checkpoint's uploads were deleted by the next
// commit).
func TestIncrementalCheckpointCrash(t *testing.T) {
	mod := testwasm.Path(t, "internal/testguests/failonce/failonce.wasm")
	eng := cachedEngine(t)
	const n, keys = 8000, 200
	for _, c := range []struct {
		at string
		to string
		p2 int
	}{
		{"none", jobfile.StatePebble, 3},
		{"upload", jobfile.StatePebble, 1},
		{"commit", jobfile.StatePebble, 3},
		{"commit", jobfile.StateMemory, 2},
	} {
		t.Run(c.at+"-to-"+c.to, func(t *testing.T) {
			dir := t.TempDir()
			out, data, root := filepath.Join(dir, "out"), filepath.Join(dir, "data"), filepath.Join(dir, "chk")
			job := func(p int) *control.JobGraph {
				gen := &jobfile.SourceSpec{Type: "generator", Count: n, Rate: 2000, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: keys, TSStep: 1}
				return graph(t,
					src("src", 2, gen),
					op("op", p, &jobfile.WasmSpec{Path: mod, Config: map[string]string{"mode": "count"}}, in("src", control.Hash)),
					sink("out", 1, &jobfile.SinkSpec{Type: "file", Path: out}, in("op", control.Rebalance)),
				)
			}
			var mu sync.Mutex
			reused := 0
			onComplete := func(md *checkpoint.Metadata) {
				if md.Kind != control.KindCheckpoint {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if md.FullSize() > md.IncrementalSize() {
					reused++
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dirStore := openStore(t, root)
			cs := &crashStore{Dir: dirStore, at: c.at, id: 3, crash: cancel, fired: make(chan struct{})}
			var cps int
			_, err := Run(ctx, job(2), Options{Engine: eng, BatchSize: 64,
				State: jobfile.StateSettings{Backend: jobfile.StatePebble, CacheMiB: 8, Incremental: true}, DataDir: data,
				Checkpoint: &CheckpointOptions{Store: cs, Interval: 40 * time.Millisecond, Tick: 5 * time.Millisecond, TolerableFailures: new(-1),
					OnComplete: func(md *checkpoint.Metadata) {
						onComplete(md)
						if cps++; cps == 3 && c.at == "none" {
							cs.fire() // right after a completed checkpoint
						}
					}}})
			select {
			case <-cs.fired:
			default:
				t.Fatalf("the run ended (%v) before it crashed at %s", err, c.at)
			}
			checkDataDirEmpty(t, data, true)

			// A new process: the store as it was left.
			store := openStore(t, root)
			md, err := store.Latest(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(md.SharedFiles()) == 0 {
				t.Fatalf("checkpoint %d refers to no shared files", md.ID)
			}
			g := job(c.p2)
			rs, err := checkpoint.LoadRestoreFrom(context.Background(), store, md, g)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Run(context.Background(), g, Options{Engine: eng, BatchSize: 64, Restore: rs,
				State: jobfile.StateSettings{Backend: c.to, CacheMiB: 8, Incremental: c.to == jobfile.StatePebble}, DataDir: data,
				Checkpoint: &CheckpointOptions{Store: store, Interval: 40 * time.Millisecond, Tick: 5 * time.Millisecond, OnComplete: onComplete}}); err != nil {
				t.Fatal(err)
			}
			checkDataDirEmpty(t, data, true) // memory too: it read the files there
			var want []string
			per := map[int]int{}
			for i := 0; i < n; i++ {
				per[i%keys]++
				want = append(want, fmt.Sprintf("key-%d=%d", i%keys, per[i%keys]))
			}
			checkExactlyOnce(t, committed(t, out), want)
			if reused == 0 {
				t.Error("no checkpoint referred to a file an earlier one uploaded")
			}
			checkSharedFiles(t, store, root)
			t.Logf("restored checkpoint %d (%d shared files, full %d B, incremental %d B); %d checkpoints reused files", md.ID, len(md.SharedFiles()), md.FullSize(), md.IncrementalSize(), reused)
		})
	}
}

// checkSharedFiles: the shared directory of root holds exactly the files
// the retained checkpoints refer to, each of the size they record.
func checkSharedFiles(t *testing.T, store *checkpoint.Dir, root string) {
	t.Helper()
	mds, err := store.Completed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]int64{}
	for _, md := range mds {
		for _, r := range md.SharedFiles() {
			live[r.Name] = r.Size
		}
	}
	ents, err := os.ReadDir(filepath.Join(root, checkpoint.SharedDir))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range ents {
		size, ok := live[e.Name()]
		if !ok {
			t.Errorf("orphaned shared file %s: no retained checkpoint refers to it", e.Name())
			continue
		}
		if info, err := e.Info(); err != nil || info.Size() != size {
			t.Errorf("shared file %s: %v bytes, want %d (%v)", e.Name(), info.Size(), size, err)
		}
		delete(live, e.Name())
	}
	for name := range live {
		t.Errorf("missing shared file %s", name)
	}
}
