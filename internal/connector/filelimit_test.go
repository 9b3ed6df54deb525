package connector

import (
	"context"
	"errors"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
)

// Lines of exactly max_record_bytes are read (with "\n", "\r\n" or no
// newline, also when the buffer splits "\r\n"); one byte more fails with an
// error naming the file, the line and the limit.
func TestFileSourceLineLimit(t *testing.T) {
	const limit = 64<<10 - 1 // so that a line with its "\r" fills the 64 KiB buffer
	long := strings.Repeat("x", limit)
	for _, c := range []struct {
		name, input string
		lines       int    // read before the error (or all of them)
		err         string // "" = none
	}{
		{"newline", long + "\n" + "a\n", 2, ""},
		{"crlf split by the buffer", long + "\r\n" + "a\r\n", 2, ""},
		{"last line without newline", "a\n" + long, 2, ""},
		{"one byte over", "a\nb\n" + long + "y\n", 2, "line 3 (byte 4): record too large: longer than max_record_bytes 65535"},
		{"one byte over with crlf", long + "y\r\n", 0, "line 1 (byte 0): record too large: longer than max_record_bytes 65535"},
		{"over at the end", long + "yz", 0, "line 1 (byte 0)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeFile(t, c.input)
			src, err := NewFileSource(path, nil, 0, 1, nil, limit)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			var got []string
			buf := make([]abi.Record, 1)
			for {
				n, err := src.Read(context.Background(), buf)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					if c.err == "" || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), path) || !errors.Is(err, abi.ErrRecordTooLarge) {
						t.Fatalf("error %v, want %q naming %s", err, c.err, path)
					}
					break
				}
				for _, r := range buf[:n] {
					if len(r.Value) > limit || strings.ContainsAny(string(r.Value), "\r\n") {
						t.Fatalf("line of %d bytes %q...", len(r.Value), r.Value[:min(10, len(r.Value))])
					}
					got = append(got, string(r.Value))
				}
			}
			if len(got) != c.lines {
				t.Errorf("read %d lines before the end, want %d", len(got), c.lines)
			}
		})
	}
}

// A file source on /dev/zero (no newline, ever) fails at once with the line
// error, having held about max_record_bytes, instead of growing without end.
func TestFileSourceDevZero(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	const limit = 8 << 20
	src, err := NewFileSource("/dev/zero", nil, 0, 1, nil, limit)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	recs := make([]abi.Record, 1024) // not the source's allocation
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err = src.Read(context.Background(), recs)
	if err == nil || !strings.Contains(err.Error(), "file source /dev/zero: line 1 (byte 0): record too large: longer than max_record_bytes 8388608") {
		t.Fatalf("error %v, want the line error", err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// The arena grows by appending up to the limit: at most about twice it
	// in total, never the GiBs an unbounded read would take.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4*limit {
		t.Errorf("read allocated %d bytes for a limit of %d", alloc, limit)
	}
	t.Logf("failed after %v", time.Since(start))
}
