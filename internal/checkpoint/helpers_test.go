package checkpoint

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

// keyedSnapshots builds the keyed state of an operator at parallelism p as
// its subtasks would hold it: each key in the subtask owning its key group.
// It returns the snapshots and every (state, key) -> value.
func keyedSnapshots(rng *rand.Rand, p, maxP, nKeys int) ([]*host.Snapshot, map[string]string) {
	snaps := make([]*host.Snapshot, p)
	for i := range snaps {
		snaps[i] = &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}, Lists: map[string]*host.ListState{}}
	}
	all := map[string]string{}
	for k := 0; k < nKeys; k++ {
		key := fmt.Sprintf("key-%d-%d", k, rng.IntN(1000))
		state := []string{"count", "sum"}[rng.IntN(2)]
		val := fmt.Sprintf("v%d", rng.IntN(1<<20))
		kg := abi.KeyGroup([]byte(key), maxP)
		sub := abi.SubtaskForKeyGroup(kg, maxP, p)
		g := snaps[sub].KeyGroups[kg]
		if g == nil {
			g = &host.KeyGroupState{Entries: map[string]map[string][]byte{}}
			snaps[sub].KeyGroups[kg] = g
		}
		if g.Entries[state] == nil {
			g.Entries[state] = map[string][]byte{}
		}
		g.Entries[state][key] = []byte(val)
		all[state+"/"+key] = val
		if rng.IntN(3) == 0 {
			ts := rng.Int64N(1000)
			g.Timers = append(g.Timers, host.Timer{Key: []byte(key), TS: ts})
			all[fmt.Sprintf("timer/%s/%d", key, ts)] = ""
		}
	}
	return snaps, all
}

// writeCheckpoint writes one subtask state per entry of states (nil: no
// blob) for a single operator "op" and commits it.
func writeCheckpoint(t *testing.T, d *Dir, kind control.CheckpointKind, id int64, states []*SubtaskState) *Metadata {
	t.Helper()
	ctx := context.Background()
	md := &Metadata{Version: FormatVersion, Job: "job", ID: id, Kind: kind, Time: time.Unix(1700000000, 0).UTC()}
	op := OperatorMeta{UID: "op", Parallelism: len(states), MaxParallelism: 128}
	for i, s := range states {
		sm := SubtaskMeta{Index: i}
		if s != nil {
			b, err := EncodeState(s)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := d.WriteState(ctx, kind, id, control.SubtaskID{Operator: "op", Index: i}, b)
			if err != nil {
				t.Fatal(err)
			}
			sm.Ref, sm.Size, sm.CRC32C = ref.Name, ref.Size, ref.CRC32C
		}
		op.Subtasks = append(op.Subtasks, sm)
	}
	md.Operators = []OperatorMeta{op}
	if err := d.Commit(ctx, md); err != nil {
		t.Fatal(err)
	}
	return md
}

func rng2time() time.Time { return time.Unix(1700000000, 0) }

func readFile(p string) ([]byte, error) { return os.ReadFile(p) }
func writeFile(p string, b []byte)      { _ = os.WriteFile(p, b, 0o644) }
