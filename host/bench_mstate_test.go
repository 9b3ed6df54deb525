package host_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

// BenchmarkMapStatePutGet: MapState put and get through the host, with the
// mstate conformance guest (WAT: each record is one mstate_put or
// mstate_get command), batches of 1000 records over 1000 keys x 16 user
// keys, on each backend. Reports ops/s (one put or one get each).
//
//	go test -run '^$' -bench MapStatePutGet ./host
func BenchmarkMapStatePutGet(b *testing.B) {
	const keys, ukeys, batch = 1000, 16, 1000
	for _, backend := range []string{host.BackendMemory, host.BackendPebble} {
		b.Run(backend, func(b *testing.B) {
			path := testwasm.Path(b, "internal/conformance/guests/wat/mstate.wasm")
			e := newEngine(b, host.WithCacheDir(b.TempDir()))
			inst := instance(b, load(b, e, path), host.InstanceConfig{NumInputs: 1,
				State: host.StateConfig{Backend: backend, DataDir: b.TempDir()}})
			field := func(b []byte, f string) []byte {
				b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
				return append(b, f...)
			}
			puts, gets := make([]abi.Record, batch), make([]abi.Record, batch)
			for n := range batch {
				k := []byte(fmt.Sprintf("key-%d", (n*7919)%keys))
				uk := fmt.Sprintf("u%d", n%ukeys)
				p := field(field(field(field([]byte{'p'}, "m"), ""), uk), "value-0123456789")
				g := field(field(field([]byte{'g'}, "m"), ""), uk)
				puts[n] = abi.Record{Key: k, Value: p, Timestamp: int64(n)}
				gets[n] = abi.Record{Key: k, Value: g, Timestamp: int64(n)}
			}
			ctx := context.Background()
			var got int
			emit := func(recs []abi.Record) { got += len(recs) }
			if err := inst.Process(ctx, 0, puts, emit); err != nil { // warm: every entry exists
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := inst.Process(ctx, 0, puts, emit); err != nil {
					b.Fatal(err)
				}
				if err := inst.Process(ctx, 0, gets, emit); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if got != b.N*batch {
				b.Fatalf("%d get results, want %d", got, b.N*batch)
			}
			b.ReportMetric(float64(2*batch*b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
