package connector

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/streamd/streamd/abi"
)

// A generator checkpointed at p=2, rescaled to 3 and then to 1 (before
// every subtask is past the first rescale) produces every record exactly
// once, each subtask in order; bounded and unbounded.
func TestGeneratorRescale(t *testing.T) {
	for _, bounded := range []bool{true, false} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			spec := genSpec()
			const total = 3000
			spec.Count = total
			if !bounded {
				spec.Count, spec.Rate = 0, 1e9
			}
			want := map[string]int64{} // record -> n
			for n := range int64(total) {
				want[fmt.Sprintf("key-%d|value-%d|%d", n%7, n, n)] = n
			}
			seen := map[string]int{}
			var pos [][]byte
			// Each stage reads an uneven prefix per subtask; the last reads to
			// the end (bounded) or past total (unbounded).
			stages := []struct {
				p     int
				reads func(j int) int
			}{
				{2, func(j int) int { return 100 + 350*j }},
				{3, func(j int) int { return 50 * (3 - j) }},
				{1, func(int) int { return -1 }},
			}
			for _, st := range stages {
				if pos != nil {
					var ok bool
					var err error
					if pos, ok, err = RescaleSourcePositions("generator", pos, st.p); !ok || err != nil {
						t.Fatalf("rescale to %d: %v %v", st.p, ok, err)
					}
				}
				next := make([][]byte, st.p)
				for j := range st.p {
					var at []byte
					if pos != nil {
						at = pos[j]
					}
					g, err := NewGenerator(spec, j, st.p, at)
					if err != nil {
						t.Fatalf("subtask %d of %d: %v", j, st.p, err)
					}
					limit := st.reads(j)
					if limit < 0 {
						limit = total // unbounded: read past total
					}
					last := int64(-1)
					buf := make([]abi.Record, 13)
					for read := 0; read < limit; {
						k, err := g.Read(context.Background(), buf[:min(len(buf), limit-read)])
						if err == io.EOF {
							break
						}
						if err != nil {
							t.Fatal(err)
						}
						for _, r := range buf[:k] {
							s := fmt.Sprintf("%s|%s|%d", r.Key, r.Value, r.Timestamp)
							n, ok := want[s]
							if !ok && bounded {
								t.Fatalf("record %s not of the sequence", s)
							}
							if ok && (n <= last || n%int64(st.p) != int64(j)) {
								t.Fatalf("subtask %d of %d produced n=%d after %d", j, st.p, n, last)
							}
							seen[s]++
							last = n
						}
						read += k
					}
					if bounded && g.remaining() == 0 {
						continue // finished: no position in the checkpoint
					}
					next[j] = g.Position()
				}
				pos = next
			}
			for s, n := range want {
				if seen[s] != 1 {
					t.Fatalf("record %d produced %d times", n, seen[s])
				}
			}
		})
	}
}
