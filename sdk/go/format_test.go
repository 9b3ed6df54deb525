package streamd

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestAppendInt: AppendInt writes what strconv.AppendInt writes, at every
// digit count and its edges, for negatives, the extremes and random values,
// after a prefix and into buffers with and without room.
func TestAppendInt(t *testing.T) {
	vals := []int64{0, 1, 9, 10, 99, 100, 12345678, 99999999, 100000000, 123456789,
		9999999999999999, 1e16, math.MaxInt64, math.MinInt64, math.MinInt64 + 1}
	for p := int64(1); p < 1e18; p *= 10 {
		vals = append(vals, p-1, p, p+1, -p, -p+1, -p-1)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		v := rng.Int64() >> rng.UintN(63)
		vals = append(vals, v, -v)
	}
	roomy := make([]byte, 0, 64)
	for _, v := range vals {
		want := strconv.AppendInt([]byte("ab,"), v, 10)
		if got := AppendInt([]byte("ab,"), v); string(got) != string(want) {
			t.Fatalf("AppendInt(%d) = %q, want %q", v, got, want)
		}
		if got := AppendInt(append(roomy[:0], "ab,"...), v); string(got) != string(want) {
			t.Fatalf("AppendInt(%d) into a roomy buffer = %q, want %q", v, got, want)
		}
		if got := AppendInt(nil, v); string(got) != string(want[3:]) {
			t.Fatalf("AppendInt(nil, %d) = %q, want %q", v, got, want[3:])
		}
	}
}

// TestAppendIntKeepsTail: the spare capacity AppendInt writes into beyond
// the digits is past the returned length, never before dst's length.
func TestAppendIntKeepsTail(t *testing.T) {
	buf := make([]byte, 3, 40)
	copy(buf, "xyz")
	got := AppendInt(buf, 7)
	if string(got) != "xyz7" || string(buf[:3]) != "xyz" {
		t.Fatalf("got %q, buf %q", got, buf[:3])
	}
}

func BenchmarkAppendInt(b *testing.B) {
	buf := make([]byte, 0, 64)
	for i := range b.N {
		buf = AppendInt(buf[:0], 1700000000000+int64(i))
	}
}
