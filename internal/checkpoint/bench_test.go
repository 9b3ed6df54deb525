package checkpoint

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/host"
)

// snapshot1M builds one subtask's keyed state: nKeys keys of 100-byte
// values in state "s", spread over 128 key groups.
func snapshot1M(nKeys int) *host.Snapshot {
	s := &host.Snapshot{KeyGroups: map[int]*host.KeyGroupState{}, Lists: map[string]*host.ListState{}}
	val := make([]byte, 100)
	for i := 0; i < nKeys; i++ {
		var k [8]byte
		binary.BigEndian.PutUint64(k[:], uint64(i))
		kg := abi.KeyGroup(k[:], abi.DefaultMaxParallelism)
		g := s.KeyGroups[kg]
		if g == nil {
			g = &host.KeyGroupState{Entries: map[string]map[string][]byte{"s": {}}}
			s.KeyGroups[kg] = g
		}
		binary.LittleEndian.PutUint64(val, uint64(i))
		g.Entries["s"][string(k[:])] = append([]byte(nil), val...)
	}
	return s
}

// BenchmarkSnapshot1MKeys writes a complete checkpoint (encode, write and
// fsync the blob, commit the metadata) of one subtask holding 1 million keys
// of 100-byte state. Target: <= 2 s per checkpoint.
func BenchmarkSnapshot1MKeys(b *testing.B) {
	snap := snapshot1M(1_000_000)
	d, err := OpenDir(b.TempDir(), WithRetain(1))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var size int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := int64(i + 1)
		ref, err := WriteSubtaskState(ctx, d, control.KindCheckpoint, id, control.SubtaskID{Operator: "agg"}, &SubtaskState{Operator: snap})
		if err != nil {
			b.Fatal(err)
		}
		md := &Metadata{Version: FormatVersion, Job: "bench", ID: id, Kind: control.KindCheckpoint, Time: time.Now(),
			Operators: []OperatorMeta{{UID: "agg", Parallelism: 1, MaxParallelism: 128,
				Subtasks: []SubtaskMeta{{Index: 0, Ref: ref.Name, Size: ref.Size, CRC32C: ref.CRC32C}}}}}
		if err := d.Commit(ctx, md); err != nil {
			b.Fatal(err)
		}
		size = ref.Size
	}
	b.StopTimer()
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/checkpoint")
	b.ReportMetric(float64(size)/(1<<20), "MiB/checkpoint")
}

// BenchmarkRestore1MKeys reads back and decodes the checkpoint of
// BenchmarkSnapshot1MKeys and redistributes it to 4 subtasks.
func BenchmarkRestore1MKeys(b *testing.B) {
	d, err := OpenDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	data, _ := EncodeState(&SubtaskState{Operator: snapshot1M(1_000_000)})
	ref, err := d.WriteState(ctx, control.KindCheckpoint, 1, control.SubtaskID{Operator: "agg"}, data)
	if err != nil {
		b.Fatal(err)
	}
	md := &Metadata{Version: FormatVersion, Job: "bench", ID: 1, Kind: control.KindCheckpoint, Time: time.Now(),
		Operators: []OperatorMeta{{UID: "agg", Parallelism: 1, MaxParallelism: 128,
			Subtasks: []SubtaskMeta{{Index: 0, Ref: ref.Name, Size: ref.Size, CRC32C: ref.CRC32C}}}}}
	if err := d.Commit(ctx, md); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := ReadState(md, md.Operators[0].Subtasks[0])
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Reassign(&OperatorSnapshot{Meta: md.Operators[0], Subtasks: []*SubtaskState{st}}, 4, 128); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/restore")
}
