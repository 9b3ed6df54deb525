package host_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

// An emit of a record over max_record_bytes fails the call with an *Error
// naming the operator, the subtask and the size; the Emitter never sees it.
func TestEmitOverMaxRecordBytes(t *testing.T) {
	m := load(t, newEngine(t), testwasm.Path(t, watConformance))
	in := []abi.Record{{Key: []byte("a"), Value: []byte("xyz"), Timestamp: 1}}
	// What the guest emits for in, without a limit to speak of.
	var size, key, value int
	inst := instance(t, m, hostCfg())
	if err := inst.Process(context.Background(), 0, in, func(recs []abi.Record) {
		for _, r := range recs {
			if n := abi.RecordBytes(r); n > size {
				size, key, value = n, len(r.Key), len(r.Value)
			}
		}
	}); err != nil || size == 0 {
		t.Fatalf("process: %v; largest record emitted %d bytes", err, size)
	}
	for _, lend := range []bool{false, true} {
		for _, limit := range []int{size, size - 1} {
			cfg := hostCfg()
			cfg.Operator, cfg.Subtask, cfg.Parallelism = "big", 0, 2
			cfg.MaxRecordBytes = limit
			cfg.LendEmits = lend
			inst := instance(t, m, cfg)
			emitted := 0
			err := inst.Process(context.Background(), 0, in, func(recs []abi.Record) { emitted += len(recs) })
			if limit == size {
				if err != nil {
					t.Fatalf("lend %v: records of exactly the limit: %v", lend, err)
				}
				continue
			}
			var he *host.Error
			if !errors.As(err, &he) || !errors.Is(err, abi.ErrRecordTooLarge) {
				t.Fatalf("lend %v: error %v: want a *host.Error of kind abi.ErrRecordTooLarge", lend, err)
			}
			for _, want := range []string{`operator "big" subtask 0/2 phase process`, "record too large",
				fmt.Sprintf("has %d bytes (key %d, value %d), over max_record_bytes %d", size, key, value, limit)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("lend %v: error %q does not say %q", lend, err, want)
				}
			}
			if emitted != 0 {
				t.Errorf("lend %v: the Emitter saw %d records of the refused emit", lend, emitted)
			}
		}
	}
}
