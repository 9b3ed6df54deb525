package nexmark

// javaRandom is java.util.Random: the 48-bit linear congruential generator
// Beam's NexmarkGenerator seeds with each event's id, reproduced draw for
// draw so that an event's fields follow from its id as in the reference.
type javaRandom struct{ seed int64 }

const (
	lcgMul  = 0x5DEECE66D
	lcgAdd  = 0xB
	lcgMask = 1<<48 - 1
)

func newJavaRandom(seed int64) javaRandom {
	return javaRandom{(seed ^ lcgMul) & lcgMask}
}

// next is Random.next(bits): the top bits of the new seed, as a Java int.
func (r *javaRandom) next(bits uint) int32 {
	r.seed = (r.seed*lcgMul + lcgAdd) & lcgMask
	return int32(uint64(r.seed) >> (48 - bits))
}

// nextInt is Random.nextInt(bound), bound > 0.
func (r *javaRandom) nextInt(bound int32) int32 {
	v := r.next(31)
	m := bound - 1
	if bound&m == 0 {
		return int32((int64(bound) * int64(v)) >> 31)
	}
	for u := v; ; u = r.next(31) {
		v = u % bound
		if u-v+m >= 0 { // Java's int overflow check
			return v
		}
	}
}

// nextInt32 is Random.nextInt().
func (r *javaRandom) nextInt32() int32 { return r.next(32) }

// nextLong is Random.nextLong().
func (r *javaRandom) nextLong() int64 {
	hi := int64(r.next(32))
	return hi<<32 + int64(r.next(32))
}

// nextDouble is Random.nextDouble().
func (r *javaRandom) nextDouble() float64 {
	return float64(int64(r.next(26))<<27+int64(r.next(27))) * (1.0 / (1 << 53))
}

// nextLongN is Beam's LongGenerator.nextLong(random, n): [0, n).
func (r *javaRandom) nextLongN(n int64) int64 {
	if n < 1<<31-1 {
		return int64(r.nextInt(int32(n)))
	}
	v := r.nextLong() % n
	if v < 0 {
		v = -v
	}
	return v
}
