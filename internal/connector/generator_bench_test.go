package connector

import (
	"context"
	"testing"

	"github.com/streamd/streamd/abi"
)

// BenchmarkGeneratorRead: an unbounded generator subtask (1 of 4) fills
// batches of 1024 records, as a source task reads it.
func BenchmarkGeneratorRead(b *testing.B) {
	spec := genSpec()
	spec.Count = 1 << 62
	g, err := NewGenerator(spec, 1, 4, nil)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]abi.Record, 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := g.Read(context.Background(), buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(buf))/b.Elapsed().Seconds(), "records/s")
}
