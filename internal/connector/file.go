package connector

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/roundrobin"
)

// FileSource reads a text file, one record per line: the value is the line
// without its newline ("\n" or "\r\n"); records have no key and no
// timestamp. With parallelism p > 1 every subtask reads the whole file and
// subtask i keeps the lines whose 0-based index is i modulo p. Standard input
// (path "-") can be read only once: subtask 0 reads all of it and the other
// subtasks produce nothing. The position is the byte offset and index of the
// next line read, and after a rescale what the subtask has yet to skip
// (rescaleFilePositions).
type FileSource struct {
	name                 string
	f                    *os.File // nil for stdin
	r                    *bufio.Reader
	subtask, parallelism int
	offset               int64 // byte offset of the next line
	line                 int64 // index of the next line
	// skip: the lines subtasks before a rescale produced (an index that
	// Covers), until the subtask is past them.
	skip roundrobin.Layers
	eof  bool
	// stream: the input is not a regular file (stdin, a pipe, a FIFO), so
	// more lines may take long to come: Read returns the lines it has
	// once the buffered input is used up instead of waiting for a full
	// batch.
	stream  bool
	maxLine int // max_record_bytes: the longest line, without its newline
	arena   []byte
	ends    []int
	lines   []int64 // 1-based line number of each record of the last Read
	// et, with a timestamp field, takes each line's event time from it
	// (SetEventTime); nil: lines have no timestamp and no watermark.
	et *EventTime
}

// SetEventTime makes the source take each line's event time from the JSON
// field of the line (a number of ms or an RFC 3339 string) and have the
// watermark max timestamp - lag. A line without a valid field fails Read,
// naming the file and the line.
func (s *FileSource) SetEventTime(field string, lag time.Duration) {
	s.et = &EventTime{Field: field, Lag: lag.Milliseconds()}
}

// maxReadBytes bounds the lines one Read returns: it stops after the line that
// reaches this many bytes (as a record writer sends a batch at
// dataplane.MaxBatchBytes), so a batch of long lines does not pile up.
const maxReadBytes = 4 << 20

// NewFileSource opens path for subtask of parallelism, resuming at pos (a
// Position() of an earlier FileSource of the same file and subtask) unless
// pos is nil. stdin is read when path is "-". A line longer than maxLine
// bytes (max_record_bytes; 0 means abi.DefaultMaxRecordBytes) fails Read as
// soon as that many bytes of it are read: memory stays bounded whatever the
// input (a device such as /dev/zero, a file without newlines).
func NewFileSource(path string, stdin io.Reader, subtask, parallelism int, pos []byte, maxLine int) (*FileSource, error) {
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("connector: file source %s: subtask %d of parallelism %d", path, subtask, parallelism)
	}
	if maxLine <= 0 {
		maxLine = abi.DefaultMaxRecordBytes
	}
	s := &FileSource{name: path, subtask: subtask, parallelism: parallelism, maxLine: maxLine}
	if pos != nil {
		var err error
		if s.offset, s.line, s.skip, err = parseFilePosition(pos); err != nil {
			return nil, fmt.Errorf("connector: file source %s: %w", path, err)
		}
	}
	if path == "-" {
		s.name = "stdin"
		if stdin == nil {
			stdin = os.Stdin
		}
		if pos != nil && (s.offset != 0 || len(s.skip) > 0) {
			return nil, fmt.Errorf("connector: file source: cannot resume stdin at byte %d (or after a rescale)", s.offset)
		}
		if subtask != 0 {
			s.eof = true
			return s, nil
		}
		// One reader only: subtask 0 takes every line.
		s.parallelism = 1
		s.r = bufio.NewReaderSize(stdin, 64<<10)
		s.stream = true
		if f, ok := stdin.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
				s.stream = false // stdin redirected from a file
			}
		}
		return s, nil
	}
	f, err := os.Open(filepath.Clean(path))
	if err != nil {
		return nil, fmt.Errorf("connector: file source: %w", err)
	}
	if s.offset > 0 {
		if _, err := f.Seek(s.offset, io.SeekStart); err != nil {
			f.Close()
			return nil, fmt.Errorf("connector: file source %s: resume at byte %d: %w", path, s.offset, err)
		}
	}
	s.f = f
	s.r = bufio.NewReaderSize(f, 64<<10)
	if fi, err := f.Stat(); err == nil && !fi.Mode().IsRegular() {
		s.stream = true
	}
	return s, nil
}

// Position encodes the byte offset and index of the next line (version 1,
// 17 bytes), and what it has yet to skip after a rescale (version 2: then
// the layers, roundrobin.AppendLayers).
func (s *FileSource) Position() []byte { return filePosition(s.offset, s.line, s.skip) }

const filePositionVersion2 = 2

func filePosition(offset, line int64, skip roundrobin.Layers) []byte {
	b := make([]byte, 17, 32)
	b[0] = positionVersion
	binary.BigEndian.PutUint64(b[1:], uint64(offset))
	binary.BigEndian.PutUint64(b[9:], uint64(line))
	if len(skip) == 0 {
		return b
	}
	b[0] = filePositionVersion2
	return roundrobin.AppendLayers(b, skip)
}

func parseFilePosition(pos []byte) (offset, line int64, skip roundrobin.Layers, err error) {
	if len(pos) < 17 || (pos[0] != positionVersion && pos[0] != filePositionVersion2) || (pos[0] == positionVersion && len(pos) != 17) {
		return 0, 0, nil, fmt.Errorf("bad position %x (want version 1, 17 bytes, or 2)", pos)
	}
	offset, line = int64(binary.BigEndian.Uint64(pos[1:])), int64(binary.BigEndian.Uint64(pos[9:]))
	if offset < 0 || line < 0 {
		return 0, 0, nil, fmt.Errorf("bad position %x: negative offset or line", pos)
	}
	if pos[0] == filePositionVersion2 {
		if skip, err = roundrobin.ParseLayers(pos[17:]); err == nil && len(skip) == 0 {
			err = fmt.Errorf("no layers")
		}
		if err != nil {
			return 0, 0, nil, fmt.Errorf("bad position %x: %w", pos, err)
		}
	}
	return offset, line, skip, nil
}

// rescaleFilePositions is the file source's RescalePositions. Old subtask
// j of q, at line index line_j, produced every line i ≡ j (mod q) below
// it (package roundrobin's model: every subtask reads the whole file); the
// new subtasks all start at the least line index of the old ones, whose
// byte offset its position has, and skip what the old subtasks produced.
func rescaleFilePositions(positions [][]byte, parallelism int) ([][]byte, error) {
	next := make([]int64, len(positions))
	old := make([]roundrobin.Layers, len(positions))
	offsets := map[int64]int64{} // line index -> byte offset
	for j, pos := range positions {
		if pos == nil {
			next[j] = roundrobin.Finished
			continue
		}
		offset, line, skip, err := parseFilePosition(pos)
		if err != nil {
			return nil, fmt.Errorf("subtask %d: %w", j, err)
		}
		next[j], old[j], offsets[line] = line, skip, offset
	}
	base, skip := roundrobin.Merge(next, old)
	offset, ok := offsets[base]
	if !ok {
		return nil, fmt.Errorf("no old subtask's position is at line %d, where the new subtasks start", base)
	}
	out := make([][]byte, parallelism)
	for j := range out {
		out[j] = filePosition(offset, base, skip)
	}
	return out, nil
}

// Watermark is abi.MinWatermark without an event-time field: lines have no
// event time; with one, the largest timestamp read minus the lag.
func (s *FileSource) Watermark() int64 {
	if s.et == nil {
		return abi.MinWatermark
	}
	return s.et.Watermark()
}

// Close closes the file.
func (s *FileSource) Close() error {
	if s.f != nil {
		err := s.f.Close()
		s.f = nil
		if err != nil {
			return fmt.Errorf("connector: file source %s: %w", s.name, err)
		}
	}
	return nil
}

// Read returns the next lines of this subtask.
func (s *FileSource) Read(ctx context.Context, recs []abi.Record) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("connector: file source %s: %w", s.name, err)
	}
	a := s.arena[:0]
	ends := s.ends[:0]
	n := 0
	for n < len(recs) && !s.eof {
		if n > 0 && s.stream && s.r.Buffered() == 0 {
			break // the next line may be long in coming: send these first
		}
		if len(a) >= maxReadBytes {
			break
		}
		start := len(a)
		var err error
		a, err = s.readLine(a)
		if err == io.EOF {
			s.eof = true
			if len(a) == start {
				break // no last line without a newline
			}
		} else if err != nil {
			s.arena, s.ends = a[:0], ends[:0]
			return 0, fmt.Errorf("connector: file source %s: line %d (byte %d): %w", s.name, s.line+1, s.offset, err)
		}
		s.offset += int64(len(a) - start)
		mine := s.line%int64(s.parallelism) == int64(s.subtask)
		if len(s.skip) > 0 {
			mine = mine && !s.skip.Covers(s.line)
			s.skip = s.skip.Trim(s.line + 1)
		}
		s.line++
		if !mine {
			a = a[:start]
			continue
		}
		// Strip the newline.
		e := len(a)
		if e > start && a[e-1] == '\n' {
			e--
			if e > start && a[e-1] == '\r' {
				e--
			}
		}
		ends = append(ends, start, e)
		if s.et != nil {
			s.lines = append(s.lines[:n], s.line)
		}
		n++
	}
	for i := 0; i < n; i++ {
		st, e := ends[2*i], ends[2*i+1]
		recs[i] = abi.Record{Value: a[st:e:e], Timestamp: abi.NoTimestamp}
		if s.et != nil {
			if err := s.et.stamp(&recs[i]); err != nil {
				s.arena, s.ends = a[:0], ends[:0]
				return 0, fmt.Errorf("connector: file source %s: line %d: %w", s.name, s.lines[i], err)
			}
		}
	}
	s.arena, s.ends = a, ends
	if n == 0 && s.eof {
		return 0, io.EOF
	}
	return n, nil
}

// Ready reports whether Read returns without waiting for input: a regular
// file, buffered input, or the end.
func (s *FileSource) Ready() bool { return s.eof || !s.stream || s.r.Buffered() > 0 }

// readLine appends the next line including its newline to dst. It fails with
// an error wrapping abi.ErrRecordTooLarge once the line, without its
// newline, is known to be longer than s.maxLine, having appended at most
// s.maxLine+1 bytes plus one buffer of it.
func (s *FileSource) readLine(dst []byte) ([]byte, error) {
	start := len(dst)
	for {
		frag, err := s.r.ReadSlice('\n')
		if len(dst)+len(frag) > cap(dst) {
			// Double (append grows large slices by 1.25x, which for one
			// long line allocates several times its size in all).
			grown := make([]byte, len(dst), max(2*cap(dst), len(dst)+len(frag)))
			copy(grown, dst)
			dst = grown
		}
		dst = append(dst, frag...)
		n := len(dst) - start // the line so far, with its newline if it has one
		switch {
		case err == nil: // ends with '\n'
			n--
			if n > 0 && dst[len(dst)-2] == '\r' {
				n--
			}
		case errors.Is(err, bufio.ErrBufferFull) && dst[len(dst)-1] == '\r':
			n-- // the '\r' of a "\r\n" split by the buffer
		}
		if n > s.maxLine {
			return dst[:start], fmt.Errorf("%w: longer than max_record_bytes %d (%d bytes read without a newline)", abi.ErrRecordTooLarge, s.maxLine, len(dst)-start)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return dst, err
		}
	}
}

// String names the source in errors.
func (s *FileSource) String() string {
	return "file source " + s.name + " subtask " + strconv.Itoa(s.subtask)
}
