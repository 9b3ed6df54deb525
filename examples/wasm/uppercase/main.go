// Command uppercase is a stateless streamd operator: it upper-cases the value
// of every record and keeps its key and timestamp.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o uppercase.wasm .
package main

import (
	"unicode"
	"unicode/utf8"

	streamd "github.com/streamd/streamd/sdk/go"
)

// buf is reused for every record: Map copies the returned record into the
// output frame before the next call, so ProcessElement does not allocate.
var buf []byte

func init() {
	streamd.Register(streamd.Map(func(r streamd.Record) streamd.Record {
		buf = appendUpper(buf[:0], r.Value)
		r.Value = buf
		return r
	}))
}

func main() {}

// appendUpper appends the upper-case form of s to dst: ASCII bytes directly,
// other UTF-8 runes through unicode.ToUpper (invalid bytes are kept as is).
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
