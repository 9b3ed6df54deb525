package connector

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/control"
)

// FileSink is the exactly-once file sink of one subtask: it writes one line
// per record (the value, or key TAB value when kv is set) with a two-phase
// commit, so every visible file in its directory is committed output:
//
// Every name starts with the sink's part prefix P: "part", or "part-<job>" for
// a sink of a deployed job (job = its job id), so that jobs writing one
// directory never touch each other's files.
//
//   - Records go to an in-progress file, ".P-<subtask>.inprogress".
//   - PreCommit(id), at checkpoint id's barrier, flushes and fsyncs it and
//     renames it to the pending file ".P-<subtask>-<id>.pending". The
//     pending files not yet committed are the sink's checkpoint state
//     (PendingState).
//   - Commit(id), on notify_checkpoint_complete(id), renames every pending
//     file of a checkpoint <= id into place as "P-<subtask>-<id>".
//     Committing what is already committed does nothing, so a restore can
//     commit the pending files of the checkpoint it restores from first
//     (CommitPending), whether or not they were committed before the failure.
//   - Without checkpointing, CommitFinal at the end of the job renames the
//     in-progress file into place as "P-<subtask>".
//
// Files whose names start with '.' are hidden: in-progress and pending data.
// Close removes the in-progress file; pending files stay for a restore.
type FileSink struct {
	dir     string
	prefix  string // "part" or "part-<job>"
	subtask int
	kv      bool

	f       *os.File // the in-progress file, nil until the first Write after a seal
	w       *bufio.Writer
	pending []PendingFile
	closed  bool
}

// PendingFile is one pending file of a FileSink: checkpoint ID sealed it.
type PendingFile struct {
	ID      int64
	Pending string // hidden name in the sink's directory
	Final   string // visible name once committed
}

// FileSinkFormat values.
const (
	FormatValue = "value"
	FormatKV    = "kv"
)

// PartPrefix is the prefix of a file sink's file names: "part", or
// "part-<job>" for the sink of job (a deployed job's id; "" for none).
func PartPrefix(job string) string {
	if job == "" {
		return "part"
	}
	return "part-" + job
}

// NewFileSink creates dir if needed and returns the sink of subtask. job is
// the deployed job's id ("" for a job that streamd run runs), which goes into
// every file name (PartPrefix). It creates no file until the first record.
func NewFileSink(dir, job string, subtask int, format string) (*FileSink, error) {
	switch format {
	case "", FormatValue, FormatKV:
	default:
		return nil, fmt.Errorf("connector: file sink %s: unknown format %q (want %q or %q)", dir, format, FormatValue, FormatKV)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		err = fmt.Errorf("connector: file sink: %w", err)
		if badPath(err) {
			err = control.NonRecoverable(err)
		}
		return nil, err
	}
	return &FileSink{dir: dir, prefix: PartPrefix(job), subtask: subtask, kv: format == FormatKV}, nil
}

func (s *FileSink) inProgressName() string {
	return "." + s.prefix + "-" + strconv.Itoa(s.subtask) + ".inprogress"
}

// Dir is the sink's directory.
func (s *FileSink) Dir() string { return s.dir }

// Write appends one line per record to the in-progress file.
func (s *FileSink) Write(recs []abi.Record) error {
	if s.closed {
		return fmt.Errorf("connector: file sink %s subtask %d: write after close", s.dir, s.subtask)
	}
	if s.f == nil {
		f, err := os.Create(filepath.Join(s.dir, s.inProgressName()))
		if err != nil {
			return fmt.Errorf("connector: file sink: %w", err)
		}
		s.f = f
		if s.w == nil {
			s.w = bufio.NewWriterSize(f, 256<<10)
		} else {
			s.w.Reset(f)
		}
	}
	for i := range recs {
		if s.kv {
			s.w.Write(recs[i].Key)
			s.w.WriteByte('\t')
		}
		s.w.Write(recs[i].Value)
		if err := s.w.WriteByte('\n'); err != nil {
			return fmt.Errorf("connector: file sink %s: %w", s.f.Name(), err)
		}
	}
	return nil
}

// Flush writes the buffered lines and fsyncs the in-progress file.
func (s *FileSink) Flush() error {
	if s.f == nil {
		return nil
	}
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("connector: file sink %s: %w", s.f.Name(), err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("connector: file sink %s: fsync: %w", s.f.Name(), err)
	}
	return nil
}

// seal flushes, fsyncs and closes the in-progress file and renames it to
// name; false when there was none.
func (s *FileSink) seal(name string) (bool, error) {
	if s.f == nil {
		return false, nil
	}
	err := s.Flush()
	if cerr := s.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("connector: file sink %s: %w", s.f.Name(), cerr)
	}
	s.f = nil
	if err != nil {
		return false, err
	}
	if err := os.Rename(filepath.Join(s.dir, s.inProgressName()), filepath.Join(s.dir, name)); err != nil {
		return false, fmt.Errorf("connector: file sink: %w", err)
	}
	return true, nil
}

// PreCommit seals the records written since the last checkpoint into the
// pending file of checkpoint id and returns the sink's checkpoint state: every
// pending file not committed yet (PendingState).
func (s *FileSink) PreCommit(id int64) ([]byte, error) {
	sub := strconv.Itoa(s.subtask)
	id10 := strconv.FormatInt(id, 10)
	final := s.prefix + "-" + sub + "-" + id10
	pf := PendingFile{ID: id, Pending: "." + final + ".pending", Final: final}
	sealed, err := s.seal(pf.Pending)
	if err != nil {
		return nil, err
	}
	if sealed {
		s.pending = append(s.pending, pf)
		if err := syncDir(s.dir); err != nil {
			return nil, err
		}
	}
	return EncodePending(s.pending), nil
}

// Commit moves every pending file of a checkpoint <= id into place.
func (s *FileSink) Commit(id int64) error {
	keep := s.pending[:0]
	var todo []PendingFile
	for _, p := range s.pending {
		if p.ID <= id {
			todo = append(todo, p)
		} else {
			keep = append(keep, p)
		}
	}
	if err := commitFiles(s.dir, todo); err != nil {
		return err
	}
	s.pending = keep
	return nil
}

// CommitPending commits the pending files recorded in a checkpoint (states
// returned by PreCommit of this or an earlier run, possibly of other
// subtasks) and then removes the hidden files of this subtask that no
// checkpoint refers to: in-progress and pending data of an attempt that
// failed. Call it before the first Write.
func (s *FileSink) CommitPending(states [][]byte) error {
	var all []PendingFile
	for _, st := range states {
		ps, err := DecodePending(st)
		if err != nil {
			return control.NonRecoverable(fmt.Errorf("connector: file sink %s subtask %d: restore: %w", s.dir, s.subtask, err))
		}
		all = append(all, ps...)
	}
	if err := commitFiles(s.dir, all); err != nil {
		return err
	}
	prefix := "." + s.prefix + "-" + strconv.Itoa(s.subtask)
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("connector: file sink: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if n == prefix+".inprogress" || (strings.HasPrefix(n, prefix+"-") && strings.HasSuffix(n, ".pending")) {
			if err := os.Remove(filepath.Join(s.dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("connector: file sink: remove stale %s: %w", n, err)
			}
		}
	}
	return nil
}

// CommitFinal, without checkpointing, moves everything written into place as
// P-<subtask> (replacing the file of an earlier attempt).
func (s *FileSink) CommitFinal() error {
	sealed, err := s.seal(s.prefix + "-" + strconv.Itoa(s.subtask))
	if err != nil || !sealed {
		return err
	}
	return syncDir(s.dir)
}

// Close closes and removes the in-progress file (its records were never
// committed); pending files stay for a restore. It is always called last.
func (s *FileSink) Close() error {
	s.closed = true
	if s.f == nil {
		return nil
	}
	name := s.f.Name()
	s.f.Close()
	s.f = nil
	if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("connector: file sink: %w", err)
	}
	return nil
}

// commitFiles renames pending files into place. A pending file that is gone
// while its final file exists was committed before: nothing to do.
func commitFiles(dir string, ps []PendingFile) error {
	if len(ps) == 0 {
		return nil
	}
	for _, p := range ps {
		from, to := filepath.Join(dir, p.Pending), filepath.Join(dir, p.Final)
		if err := os.Rename(from, to); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				if _, serr := os.Stat(to); serr == nil {
					continue // committed already
				}
				return fmt.Errorf("connector: file sink %s: commit of checkpoint %d: neither the pending file %s nor the committed file %s exists: %w",
					dir, p.ID, p.Pending, p.Final, err)
			}
			return fmt.Errorf("connector: file sink %s: commit of checkpoint %d: %w", dir, p.ID, err)
		}
	}
	return syncDir(dir)
}

// badPath reports whether err says that a path cannot be used whatever the
// attempt: it does not exist under a parent that cannot be written (/proc),
// it is not a directory, it is read-only, or permission is denied.
func badPath(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrExist) ||
		errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EROFS)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("connector: file sink: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("connector: file sink: fsync %s: %w", dir, err)
	}
	return nil
}

const pendingVersion = 1

// EncodePending encodes pending files as a sink's checkpoint state:
// u8 version, u32 count, then per file: i64 id, bytes pending, bytes final
// (big-endian; bytes = u32 length + bytes).
func EncodePending(ps []PendingFile) []byte {
	b := []byte{pendingVersion}
	b = binary.BigEndian.AppendUint32(b, uint32(len(ps)))
	for _, p := range ps {
		b = binary.BigEndian.AppendUint64(b, uint64(p.ID))
		b = binary.BigEndian.AppendUint32(b, uint32(len(p.Pending)))
		b = append(b, p.Pending...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(p.Final)))
		b = append(b, p.Final...)
	}
	return b
}

// DecodePending decodes EncodePending's output. Names must be plain file names.
func DecodePending(b []byte) ([]PendingFile, error) {
	bad := func(why string) ([]PendingFile, error) {
		return nil, fmt.Errorf("connector: bad pending-file state: %s", why)
	}
	if len(b) < 5 || b[0] != pendingVersion {
		return bad("no version header")
	}
	n := binary.BigEndian.Uint32(b[1:])
	b = b[5:]
	str := func() (string, bool) {
		if len(b) < 4 {
			return "", false
		}
		l := binary.BigEndian.Uint32(b)
		if uint64(len(b)-4) < uint64(l) {
			return "", false
		}
		s := string(b[4 : 4+l])
		b = b[4+l:]
		return s, true
	}
	var out []PendingFile
	for i := uint32(0); i < n; i++ {
		if len(b) < 8 {
			return bad("truncated")
		}
		p := PendingFile{ID: int64(binary.BigEndian.Uint64(b))}
		b = b[8:]
		var ok1, ok2 bool
		p.Pending, ok1 = str()
		p.Final, ok2 = str()
		if !ok1 || !ok2 {
			return bad("truncated")
		}
		if filepath.Base(p.Pending) != p.Pending || filepath.Base(p.Final) != p.Final || p.Final == "" || p.Pending == "" {
			return bad(fmt.Sprintf("file names %q, %q are not plain names", p.Pending, p.Final))
		}
		out = append(out, p)
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return out, nil
}

// StdoutSink writes one line per record (the value) to a writer shared by
// every stdout sink subtask of a run; mu serializes them, and each batch's
// lines are written together. It is not transactional.
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

// CommitPendingUpTo commits every pending file in dir of a checkpoint <= id
// that a sink with part prefix prefix (PartPrefix) wrote, whatever subtask
// wrote it. A file sink whose operator was fully finished in checkpoint id
// keeps no state in it (only the finished flag), yet the job may have failed
// after that checkpoint completed and before every sink subtask committed its
// final pending file: restoring such a sink calls this once. The files of
// other jobs in dir (other prefixes) are left alone.
func CommitPendingUpTo(dir, prefix string, id int64) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("connector: file sink: %w", err)
	}
	var todo []PendingFile
	for _, e := range ents {
		n := e.Name()
		rest, ok := strings.CutPrefix(n, "."+prefix+"-")
		if !ok {
			continue
		}
		rest, ok = strings.CutSuffix(rest, ".pending") // <sub>-<id>
		sub, idText, ok2 := strings.Cut(rest, "-")
		if !ok || !ok2 || !allDigits(sub) || !allDigits(idText) {
			continue
		}
		cid, err := strconv.ParseInt(idText, 10, 64)
		if err != nil || cid > id {
			continue
		}
		todo = append(todo, PendingFile{ID: cid, Pending: n, Final: prefix + "-" + rest})
	}
	return commitFiles(dir, todo)
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
