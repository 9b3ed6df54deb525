package connector

import (
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/abi"
)

// HeaderArena holds the header blocks (abi.Record.Headers) of the records a
// source reads. A block is never overwritten: a full chunk is replaced, not
// reused, so a record's headers stay valid as long as the record is
// referenced, whatever the caller does with the next Read.
type HeaderArena struct{ buf []byte }

// Reserve returns an empty slice with room for n bytes in the arena, to
// append a header block of at most n bytes to.
func (a *HeaderArena) Reserve(n int) []byte {
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, max(64<<10, n))
	}
	at := len(a.buf)
	a.buf = a.buf[:at+n]
	return a.buf[at : at : at+n]
}

// natsHeaderBlock is the header block of a message's headers, in the arena:
// every header but streamd's and NATS' own (reservedHeader), by name, each
// name's values in order; nil when none is left.
func natsHeaderBlock(a *HeaderArena, h nats.Header) []byte {
	n := 0
	for name, vs := range h {
		if !reservedHeader(name) {
			for _, v := range vs {
				n += 8 + len(name) + len(v)
			}
		}
	}
	if n == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	for name := range h {
		if !reservedHeader(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	b := a.Reserve(n)
	for _, name := range names {
		for _, v := range h[name] {
			b = abi.AppendHeader(b, name, []byte(v))
		}
	}
	return b
}
