package uppercase_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

func open(tb testing.TB) *host.Instance {
	tb.Helper()
	ctx := context.Background()
	eng, err := host.NewEngine(ctx, host.WithCacheDir(""))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { eng.Close(ctx) })
	mod, err := eng.LoadFile(ctx, testwasm.Path(tb, "examples/wasm/uppercase-rust/uppercase_rust.wasm"))
	if err != nil {
		tb.Fatal(err)
	}
	inst, err := mod.NewInstance(ctx, host.InstanceConfig{Job: "bench", Operator: "upper", Parallelism: 1, NumInputs: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { inst.Close(ctx) })
	if err := inst.Open(ctx); err != nil {
		tb.Fatal(err)
	}
	return inst
}

func TestUppercase(t *testing.T) {
	inst := open(t)
	ctx := context.Background()
	in := []abi.Record{
		{Key: []byte("k1"), Value: []byte("hello, World 42!"), Timestamp: 7},
		{Value: []byte(""), Timestamp: abi.NoTimestamp},
		{Key: []byte("kÉ"), Value: []byte("déjà vu"), Timestamp: -1},
	}
	// A batch bigger than the SDK's 64 KiB output frame and the first input buffer.
	for i := 0; i < 3000; i++ {
		in = append(in, abi.Record{Key: []byte(fmt.Sprint(i)), Value: bytes.Repeat([]byte("abcXyz-"), 10+i%20), Timestamp: int64(i)})
	}
	var out []abi.Record
	frames := 0
	if err := inst.Process(ctx, 0, in, func(recs []abi.Record) { frames++; out = append(out, recs...) }); err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) {
		t.Fatalf("got %d records, want %d", len(out), len(in))
	}
	if frames < 2 {
		t.Errorf("%d emit frames for %d records; the SDK should flush about every 64 KiB", frames, len(in))
	}
	for i := range in {
		want := abi.Record{Key: in[i].Key, Value: asciiUpper(in[i].Value), Timestamp: in[i].Timestamp}
		if !bytes.Equal(out[i].Key, want.Key) || !bytes.Equal(out[i].Value, want.Value) || out[i].Timestamp != want.Timestamp {
			t.Fatalf("record %d: got %q/%q/%d, want %q/%q/%d", i, out[i].Key, out[i].Value, out[i].Timestamp, want.Key, want.Value, want.Timestamp)
		}
	}
	if string(out[2].Value) != "DéJà VU" {
		t.Errorf("non-ASCII bytes must pass unchanged: got %q", out[2].Value)
	}
}

func asciiUpper(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		out[i] = c
	}
	return out
}

// BenchmarkUppercase100B measures the map through the host: batches of 1024
// records of 100-byte values (and 8-byte keys).
func BenchmarkUppercase100B(b *testing.B) {
	inst := open(b)
	ctx := context.Background()
	batch := make([]abi.Record, 1024)
	for i := range batch {
		batch[i] = abi.Record{Key: []byte(fmt.Sprintf("key-%04d", i)), Value: bytes.Repeat([]byte("abcdefghij"), 10), Timestamp: int64(i)}
	}
	n := 0
	emit := func(recs []abi.Record) { n += len(recs) }
	b.SetBytes(int64(len(batch) * 100))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := inst.Process(ctx, 0, batch, emit); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n != b.N*len(batch) {
		b.Fatalf("emitted %d records, want %d", n, b.N*len(batch))
	}
	b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "records/s")
}
