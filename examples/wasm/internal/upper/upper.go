// Package upper is the uppercase map of the uppercase examples: the raw byte
// API's (examples/wasm/uppercase) and the typed helpers' twin that
// BenchmarkTypedVsRaw compares it with (examples/wasm/uppercase/typed).
package upper

import (
	"encoding/binary"
	"unicode"
	"unicode/utf8"
)

// Append appends the upper-case form of s to dst. ASCII is converted in
// place, eight bytes at a time: Go's wasm code is slow on byte loops, and
// this is three times faster than one byte per turn. From the first
// non-ASCII byte on, runes go through unicode.ToUpper (invalid UTF-8 bytes are
// kept as they are).
func Append(dst, s []byte) []byte {
	n := len(dst)
	dst = append(dst, s...)
	d := dst[n:]
	i := 0
	for ; i+8 <= len(d); i += 8 {
		w := binary.LittleEndian.Uint64(d[i:])
		if w&0x8080808080808080 != 0 {
			return appendUnicode(dst[:n+i], s[i:])
		}
		// In each byte b < 0x80: b+0x1f has its top bit set iff b >= 'a',
		// and b+0x05 iff b > 'z'; flipping bit 5 of 'a'..'z' upper-cases them.
		lower := (w + 0x1f1f1f1f1f1f1f1f) &^ (w + 0x0505050505050505) & 0x8080808080808080
		binary.LittleEndian.PutUint64(d[i:], w^(lower>>2))
	}
	for ; i < len(d); i++ {
		c := d[i]
		if c >= utf8.RuneSelf {
			return appendUnicode(dst[:n+i], s[i:])
		}
		if 'a' <= c && c <= 'z' {
			d[i] = c - ('a' - 'A')
		}
	}
	return dst
}

// appendUnicode appends the upper-case form of s to dst, rune by rune.
func appendUnicode(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, s[i])
		} else {
			dst = utf8.AppendRune(dst, unicode.ToUpper(r))
		}
		i += n
	}
	return dst
}
