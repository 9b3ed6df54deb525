package host

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
)

// stderrTailLines is how many stderr lines an *Error keeps.
const stderrTailLines = 20

// maxLineBytes caps one guest output line; longer lines are split.
const maxLineBytes = 16 << 10

// lineWriter receives a guest's stdout or stderr (WASI fd_write), logs it line
// by line and remembers the last lines for error reports.
type lineWriter struct {
	mu     sync.Mutex
	logger *slog.Logger // nil: keep the tail only
	level  slog.Level
	stream string
	buf    []byte   // incomplete line
	tail   []string // ring of the last stderrTailLines lines
	crash  string   // the last panic / fatal error line, which a long dump may push out of tail
	next   int
	full   bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			if len(w.buf) >= maxLineBytes {
				w.line(w.buf)
				w.buf = w.buf[:0]
			}
			break
		}
		if len(w.buf) > 0 {
			w.buf = append(w.buf, p[:i]...)
			w.line(w.buf)
			w.buf = w.buf[:0]
		} else {
			w.line(p[:i])
		}
		p = p[i+1:]
	}
	return n, nil
}

func (w *lineWriter) line(b []byte) {
	s := strings.TrimRight(string(b), "\r")
	if w.logger != nil {
		w.logger.Log(context.Background(), w.level, s, "stream", w.stream)
	}
	if isCrashLine(s) {
		w.crash = s
	}
	if w.tail == nil {
		w.tail = make([]string, stderrTailLines)
	}
	w.tail[w.next] = s
	w.next = (w.next + 1) % stderrTailLines
	if w.next == 0 {
		w.full = true
	}
}

func isCrashLine(l string) bool {
	return strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") || strings.Contains(l, "panicked at")
}

// crashLine returns the last panic or fatal error line seen.
func (w *lineWriter) crashLine() string {
	w.flush()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.crash
}

// flush emits a pending incomplete line.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.line(w.buf)
		w.buf = w.buf[:0]
	}
}

// lines returns the remembered lines, oldest first.
func (w *lineWriter) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tail == nil {
		return nil
	}
	var out []string
	if w.full {
		out = append(out, w.tail[w.next:]...)
	}
	return append(out, w.tail[:w.next]...)
}

// text is the remembered tail as one string.
func (w *lineWriter) text() string {
	w.flush()
	return strings.Join(w.lines(), "\n")
}

// tailBuffer keeps the stderr of a load-time throwaway instance.
type tailBuffer struct{ lineWriter }

func (t *tailBuffer) suffix() string {
	if s := t.text(); s != "" {
		return "\nguest stderr:\n" + s
	}
	return ""
}
