package host_test

import (
	"context"
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
