package streamd

import (
	"encoding/binary"
	"strconv"
)

// AppendInt appends the decimal form of x to dst and returns the result, as
// strconv.AppendInt(dst, x, 10) does. It is written for Go's wasm code,
// where every loop turn, call and memory access is dear: it computes eight
// digits at a time in a register and stores them with one write, so a
// number below 1e16 takes at most two stores and no loop. Larger numbers go
// through strconv.
func AppendInt(dst []byte, x int64) []byte {
	if x < 0 {
		if x == -x { // math.MinInt64
			return strconv.AppendInt(dst, x, 10)
		}
		dst = append(dst, '-')
		x = -x
	}
	u := uint64(x)
	if u >= 1e16 {
		return strconv.AppendUint(dst, u, 10)
	}
	l := len(dst)
	if cap(dst)-l < 16 {
		dst = growBytes(dst, 16)
	}
	b := dst[l : l+16]
	if u < 1e8 {
		n := digitCount8(uint32(u))
		binary.LittleEndian.PutUint64(b, digits8(uint32(u))>>(64-8*n))
		return dst[:l+int(n)]
	}
	hi := uint32(u / 1e8)
	n := digitCount8(hi)
	binary.LittleEndian.PutUint64(b, digits8(hi)>>(64-8*n))
	binary.LittleEndian.PutUint64(b[n:], digits8(uint32(u-uint64(hi)*1e8)))
	return dst[:l+int(n)+8]
}

// growBytes returns dst with room for n more bytes past its length.
//
//go:noinline
func growBytes(dst []byte, n int) []byte {
	return append(dst, make([]byte, n)...)[:len(dst)]
}

// digits8 returns the eight decimal digits of v < 1e8, zero-padded, as
// ASCII in a little-endian word: the most significant digit in the lowest
// byte. It splits v into two 4-digit halves (one per 32-bit lane), each
// into 2-digit quarters, each into digits, with multiplications by
// reciprocals that are exact in these ranges: n/100 = n*10486>>20 for
// n < 10000 and n/10 = n*103>>10 for n < 100.
func digits8(v uint32) uint64 {
	hi := v / 10000
	x := uint64(hi) | uint64(v-hi*10000)<<32
	y := (x * 10486 >> 20) & 0x0000007F0000007F
	x = y | (x-y*100)<<16
	z := (x * 103 >> 10) & 0x000F000F000F000F
	x = z | (x-z*10)<<8
	return x | 0x3030303030303030
}

// digitCount8 is the number of decimal digits of v < 1e8 (1 for 0).
func digitCount8(v uint32) uint {
	if v < 1e4 {
		if v < 100 {
			if v < 10 {
				return 1
			}
			return 2
		}
		if v < 1000 {
			return 3
		}
		return 4
	}
	if v < 1e6 {
		if v < 1e5 {
			return 5
		}
		return 6
	}
	if v < 1e7 {
		return 7
	}
	return 8
}
