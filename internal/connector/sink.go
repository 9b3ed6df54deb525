package connector

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/streamd/streamd/abi"
)

// FileSink writes one file per subtask, "part-<subtask>" in a directory, one
// line per record: the value, or key TAB value when kv is set. All file
// handling of the sink lives in this type (the two-phase-commit version will
// write to a pending file and rename on commit).
type FileSink struct {
	path string
	f    *os.File
	w    *bufio.Writer
	kv   bool
}

// FileSinkFormat values.
const (
	FormatValue = "value"
	FormatKV    = "kv"
)

// NewFileSink creates dir if needed and creates (truncates) dir/part-<subtask>.
func NewFileSink(dir string, subtask int, format string) (*FileSink, error) {
	switch format {
	case "", FormatValue, FormatKV:
	default:
		return nil, fmt.Errorf("connector: file sink %s: unknown format %q (want %q or %q)", dir, format, FormatValue, FormatKV)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("connector: file sink: %w", err)
	}
	path := filepath.Join(dir, "part-"+strconv.Itoa(subtask))
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("connector: file sink: %w", err)
	}
	return &FileSink{path: path, f: f, w: bufio.NewWriterSize(f, 256<<10), kv: format == FormatKV}, nil
}

// Path is the file the sink writes.
func (s *FileSink) Path() string { return s.path }

// Write appends one line per record.
func (s *FileSink) Write(recs []abi.Record) error {
	if s.f == nil {
		return fmt.Errorf("connector: file sink %s: write after close", s.path)
	}
	for i := range recs {
		if s.kv {
			s.w.Write(recs[i].Key)
			s.w.WriteByte('\t')
		}
		s.w.Write(recs[i].Value)
		if err := s.w.WriteByte('\n'); err != nil {
			return fmt.Errorf("connector: file sink %s: %w", s.path, err)
		}
	}
	return nil
}

// Flush writes the buffered lines and fsyncs the file.
func (s *FileSink) Flush() error {
	if s.f == nil {
		return nil
	}
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("connector: file sink %s: %w", s.path, err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("connector: file sink %s: fsync: %w", s.path, err)
	}
	return nil
}

// Close flushes, fsyncs and closes the file.
func (s *FileSink) Close() error {
	if s.f == nil {
		return nil
	}
	err := s.Flush()
	if cerr := s.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("connector: file sink %s: %w", s.path, cerr)
	}
	s.f = nil
	return err
}

// StdoutSink writes one line per record (the value) to a writer shared by
// every stdout sink subtask of a run; mu serializes them, and each batch's
// lines are written together.
type StdoutSink struct {
	w   io.Writer
	mu  *sync.Mutex
	buf []byte
}

// NewStdoutSink returns a sink writing to w under mu.
func NewStdoutSink(w io.Writer, mu *sync.Mutex) *StdoutSink {
	return &StdoutSink{w: w, mu: mu}
}

// Write writes the values of recs, one per line, in one write.
func (s *StdoutSink) Write(recs []abi.Record) error {
	for i := range recs {
		s.buf = append(s.buf, recs[i].Value...)
		s.buf = append(s.buf, '\n')
	}
	return s.Flush()
}

// Flush writes the buffered lines.
func (s *StdoutSink) Flush() error {
	if len(s.buf) == 0 {
		return nil
	}
	s.mu.Lock()
	_, err := s.w.Write(s.buf)
	s.mu.Unlock()
	s.buf = s.buf[:0]
	if err != nil {
		return fmt.Errorf("connector: stdout sink: %w", err)
	}
	return nil
}

// Close flushes.
func (s *StdoutSink) Close() error { return s.Flush() }

// DiscardSink drops every record.
type DiscardSink struct{}

func (DiscardSink) Write([]abi.Record) error { return nil }
func (DiscardSink) Flush() error             { return nil }
func (DiscardSink) Close() error             { return nil }
