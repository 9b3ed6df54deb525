package checkpoint

import (
	"math/rand/v2"
	"testing"
)

// crc32cCombine agrees with reading the bytes, for every split of random
// data (empty parts included).
func TestCRC32CCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 64, 1000, 1 << 16} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		whole := crc32c(b)
		for _, at := range []int{0, n / 3, n / 2, n} {
			if got := crc32cCombine(crc32c(b[:at]), crc32c(b[at:]), int64(n-at)); got != whole {
				t.Fatalf("len %d split at %d: combined %08x, want %08x", n, at, got, whole)
			}
		}
	}
}
