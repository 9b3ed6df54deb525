package host_test

import (
	"context"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

// Benchmarks of the Wasm boundary. Each reports ns/record; compare
// BenchmarkCallPerRecord with BenchmarkCallBatched for the cost of a call, and
// the uppercase guests with BenchmarkNativeGo for the cost of Wasm itself.
//
//	go test -run '^$' -bench . ./host

const (
	benchRecordSize = 100
	benchBatch      = 1000
)

// benchGuests: noop measures the pure boundary (its process does nothing); the
// uppercase maps (Go SDK, Rust SDK) emit one upper-cased record per input.
var benchGuests = []struct{ name, target string }{
	{"noop-wat", "host/testdata/noop.wasm"},
	{"uppercase-go", "examples/wasm/uppercase/uppercase.wasm"},
	{"uppercase-rust", "examples/wasm/uppercase-rust/uppercase_rust.wasm"},
}

func benchInstance(b *testing.B, target string, opts ...host.Option) *host.Instance {
	b.Helper()
	return benchInstanceConfig(b, target, host.InstanceConfig{NumInputs: 1}, opts...)
}

// benchInstanceConfig is benchInstance with the instance's config.
func benchInstanceConfig(b *testing.B, target string, cfg host.InstanceConfig, opts ...host.Option) *host.Instance {
	b.Helper()
	if ok, err := testwasm.HasTarget(target); err != nil || !ok {
		b.Skipf("no make target %s (%v)", target, err)
	}
	path := testwasm.Path(b, target)
	opts = append([]host.Option{host.WithCacheDir(b.TempDir())}, opts...)
	e := newEngine(b, opts...)
	return instance(b, load(b, e, path), cfg)
}

func benchRecords(n int) []abi.Record {
	recs := make([]abi.Record, n)
	for i := range recs {
		v := make([]byte, benchRecordSize)
		for j := range v {
			v[j] = 'a' + byte((i+j)%26)
		}
		recs[i] = abi.Record{Value: v, Timestamp: int64(i)}
	}
	return recs
}

// BenchmarkCallPerRecord: one streamd_process call per 100-byte record.
func BenchmarkCallPerRecord(b *testing.B) {
	for _, g := range benchGuests {
		b.Run(g.name, func(b *testing.B) {
			inst := benchInstance(b, g.target)
			recs := benchRecords(benchBatch)
			ctx := context.Background()
			out := 0
			emit := func(r []abi.Record) { out += len(r) }
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				if err := inst.Process(ctx, 0, recs[n%benchBatch:n%benchBatch+1], emit); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/record")
		})
	}
}

// BenchmarkCallBatched: batches of 1000 records of 100 bytes per call, with
// the guard (the default: instrumented loops, 1m call deadline) and without
// it (no instrumentation, no deadline: the guest can freeze the process),
// which is what the guard costs.
func BenchmarkCallBatched(b *testing.B) {
	for _, g := range benchGuests {
		for _, guard := range []bool{true, false} {
			name, opts := g.name+"/guard", []host.Option(nil)
			if !guard {
				name, opts = g.name+"/unguarded", []host.Option{host.WithGuard(false), host.WithCallDeadline(0)}
			}
			b.Run(name, func(b *testing.B) {
				inst := benchInstance(b, g.target, opts...)
				recs := benchRecords(benchBatch)
				ctx := context.Background()
				out := 0
				emit := func(r []abi.Record) { out += len(r) }
				b.ReportAllocs()
				b.SetBytes(benchBatch * benchRecordSize)
				b.ResetTimer()
				for n := 0; n < b.N; n++ {
					if err := inst.Process(ctx, 0, recs, emit); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/record")
				if g.name != "noop-wat" && out != b.N*benchBatch {
					b.Fatalf("guest emitted %d records, want %d", out, b.N*benchBatch)
				}
			})
		}
	}
}

// BenchmarkNativeGo: the uppercase map of examples/wasm/uppercase in plain Go,
// writing the output records into a reused buffer (the best case for native).
func BenchmarkNativeGo(b *testing.B) {
	recs := benchRecords(benchBatch)
	out := make([]abi.Record, benchBatch)
	var buf []byte
	b.ReportAllocs()
	b.SetBytes(benchBatch * benchRecordSize)
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		buf = buf[:0]
		for i, r := range recs {
			start := len(buf)
			buf = appendUpper(buf, r.Value)
			out[i] = abi.Record{Key: r.Key, Value: buf[start:len(buf):len(buf)], Timestamp: r.Timestamp}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchBatch), "ns/record")
	if string(out[0].Value[:3]) != "ABC" {
		b.Fatalf("not upper-cased: %q", out[0].Value)
	}
}

// appendUpper is the same function as in examples/wasm/uppercase.
func appendUpper(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, c)
		} else {
			dst = utf8.AppendRune(dst, unicode.ToUpper(r))
		}
		i += n
	}
	return dst
}

// BenchmarkCompile: loading the Go uppercase module without a cache (a full
// compile), and from a warm on-disk cache in a fresh engine (a new process).
func BenchmarkCompile(b *testing.B) {
	target := "examples/wasm/uppercase/uppercase.wasm"
	if ok, _ := testwasm.HasTarget(target); !ok {
		target = "internal/conformance/guests/wat/conformance.wasm"
	}
	path := testwasm.Path(b, target)
	ctx := context.Background()
	loadOnce := func(opts ...host.Option) error {
		e, err := host.NewEngine(ctx, opts...)
		if err != nil {
			return err
		}
		defer e.Close(ctx)
		_, err = e.LoadFile(ctx, path)
		return err
	}
	run := func(b *testing.B, opts ...host.Option) {
		for n := 0; n < b.N; n++ {
			if err := loadOnce(opts...); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("Cold", func(b *testing.B) { run(b, host.WithCacheDir("")) })
	b.Run("Cached", func(b *testing.B) {
		dir := b.TempDir()
		if err := loadOnce(host.WithCacheDir(dir)); err != nil { // warm the cache
			b.Fatal(err)
		}
		b.ResetTimer()
		run(b, host.WithCacheDir(dir))
	})
}

// BenchmarkCallBatchedGuardOnVsOff alternates one batched call (1000 x 100 B)
// on a guarded instance (the default) and one on an unguarded instance, so
// both see the same machine, and reports the guarded throughput as a
// percentage of the unguarded one.
func BenchmarkCallBatchedGuardOnVsOff(b *testing.B) {
	for _, g := range benchGuests {
		b.Run(g.name, func(b *testing.B) {
			insts := []*host.Instance{
				benchInstance(b, g.target, host.WithGuard(false), host.WithCallDeadline(0)),
				benchInstance(b, g.target),
			}
			recs := benchRecords(benchBatch)
			ctx := context.Background()
			emit := func([]abi.Record) {}
			var spent [2]time.Duration
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				for i, inst := range insts {
					start := time.Now()
					if err := inst.Process(ctx, 0, recs, emit); err != nil {
						b.Fatal(err)
					}
					spent[i] += time.Since(start)
				}
			}
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N*benchBatch) }
			b.ReportMetric(per(spent[0]), "off-ns/record")
			b.ReportMetric(per(spent[1]), "on-ns/record")
			b.ReportMetric(100*per(spent[0])/per(spent[1]), "on-%-of-off")
		})
	}
}
