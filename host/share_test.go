package host_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

// Two Modules of the same bytes share one compiled module: closing one (an
// attempt that ended) leaves the other usable, also while loads and closes of
// the same bytes run concurrently, as on a host running several jobs of one
// module (wazero issue #2336 breaks the other compiled module otherwise).
func TestSameBytesShareCompiledModule(t *testing.T) {
	path := testwasm.Path(t, watConformance)
	e := newEngine(t)
	ctx := context.Background()
	first, second := load(t, e, path), load(t, e, path)
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(ctx); err != nil { // twice: no second release
		t.Fatal(err)
	}
	inst := instance(t, second, hostCfg())
	var out []abi.Record
	if err := inst.Process(ctx, 0, []abi.Record{{Key: []byte("k"), Value: []byte("x"), Timestamp: 1}}, func(r []abi.Record) { out = append(out, r...) }); err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 {
		t.Fatalf("emitted %d records, want 1", len(out))
	}

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 8; n++ {
				m, err := e.LoadFile(ctx, path)
				if err != nil {
					errs <- err
					return
				}
				i, err := m.NewInstance(ctx, hostCfg())
				if err == nil {
					err = i.Open(ctx)
					i.Close(ctx)
				}
				if err != nil {
					errs <- err
				}
				m.Close(ctx)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The module still held is still usable.
	inst2 := instance(t, second, hostCfg())
	if err := inst2.Process(ctx, 0, []abi.Record{{Key: []byte("k"), Value: []byte("y"), Timestamp: 2}}, func([]abi.Record) {}); err != nil {
		t.Fatal(err)
	}
}

func hostCfg() host.InstanceConfig {
	return host.InstanceConfig{Job: "job", Operator: "op", Parallelism: 1, NumInputs: 1}
}

// With LendEmits the Emitter sees the same records as with copies, during the
// call; the host allocates nothing per emit.
func TestLendEmits(t *testing.T) {
	path := testwasm.Path(t, watConformance)
	e := newEngine(t)
	ctx := context.Background()
	m := load(t, e, path)
	in := []abi.Record{{Key: []byte("a"), Value: []byte("x"), Timestamp: 1}, {Key: []byte("b"), Value: []byte("y"), Timestamp: 2}, {Key: []byte("a"), Value: []byte("z"), Timestamp: 3}}
	run := func(lend bool) []string {
		cfg := hostCfg()
		cfg.LendEmits = lend
		inst := instance(t, m, cfg)
		var got []string
		for n := 0; n < 3; n++ {
			if err := inst.Process(ctx, 0, in, func(recs []abi.Record) {
				for _, r := range recs {
					got = append(got, fmt.Sprintf("%s/%q/%d", r.Key, r.Value, r.Timestamp))
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		return got
	}
	owned, lent := run(false), run(true)
	if strings.Join(owned, " ") != strings.Join(lent, " ") || len(lent) != 9 {
		t.Fatalf("lent emits %v, owned %v", lent, owned)
	}
	cfg := hostCfg()
	cfg.LendEmits = true
	inst := instance(t, m, cfg)
	emit := func([]abi.Record) {}
	allocs := testing.AllocsPerRun(100, func() {
		if err := inst.Process(ctx, 0, in, emit); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("Process with lent emits allocates %.1f times per call, want 0", allocs)
	}
}
