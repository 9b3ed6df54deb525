package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/streamd/streamd/internal/runtime"
)

// Progress modes (the progress setting).
const (
	progressAuto  = "auto"  // table on a terminal, log lines otherwise
	progressTable = "table" // redraw a table every second
	progressLog   = "log"   // a log line per operator every logEvery
	progressOff   = "off"
)

const logEvery = 5 * time.Second

// progress shows runtime.Stats as they arrive: a table redrawn in place on a
// terminal, or plain log lines. It is called from the runtime's goroutine.
type progress struct {
	mu      sync.Mutex
	mode    string
	out     io.Writer
	log     *slog.Logger
	drawn   int // lines of the table drawn last (table mode)
	prev    runtime.Stats
	nextLog time.Duration
}

func newProgress(mode string, out io.Writer, log *slog.Logger) *progress {
	return &progress{mode: mode, out: out, log: log, nextLog: logEvery}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// update takes the runtime's stats (about once per second).
func (p *progress) update(s runtime.Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rates := ratesBetween(p.prev, s)
	switch p.mode {
	case progressTable:
		p.draw(s, rates)
	case progressLog:
		if s.Elapsed >= p.nextLog {
			for _, op := range s.Operators {
				p.log.Info("progress", "operator", op.UID, "parallelism", op.Parallelism,
					"in", op.RecordsIn, "out", op.RecordsOut, "rate", fmt.Sprintf("%.0f/s", rates[op.UID]),
					"elapsed", s.Elapsed.Round(time.Second))
			}
			for p.nextLog <= s.Elapsed {
				p.nextLog += logEvery
			}
		}
	}
	p.prev = s
}

// ratesBetween returns records per second per operator between two stats:
// records in, or records out for sources (which have no input).
func ratesBetween(a, b runtime.Stats) map[string]float64 {
	dt := (b.Elapsed - a.Elapsed).Seconds()
	before := map[string]int64{}
	for _, op := range a.Operators {
		before[op.UID] = throughput(op)
	}
	r := map[string]float64{}
	for _, op := range b.Operators {
		if dt > 0 {
			r[op.UID] = float64(throughput(op)-before[op.UID]) / dt
		}
	}
	return r
}

func throughput(op runtime.OperatorStats) int64 {
	if op.RecordsIn == 0 {
		return op.RecordsOut
	}
	return op.RecordsIn
}

// draw redraws the table in place: cursor up over the last table, clear to the end.
func (p *progress) draw(s runtime.Stats, rates map[string]float64) {
	var b strings.Builder
	if p.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\x1b[J", p.drawn)
	}
	table := statsTable(s, rates, fmt.Sprintf("running %v", s.Elapsed.Round(time.Second)))
	b.WriteString(table)
	p.drawn = strings.Count(table, "\n")
	io.WriteString(p.out, b.String())
}

// finish shows the last stats: in table mode the table is redrawn a last time
// with average rates; in log mode one line per operator is logged.
func (p *progress) finish(s runtime.Stats, status string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	avg := ratesBetween(runtime.Stats{}, s)
	switch p.mode {
	case progressTable:
		if p.drawn > 0 {
			fmt.Fprintf(p.out, "\x1b[%dA\x1b[J", p.drawn)
			p.drawn = 0
		}
		io.WriteString(p.out, statsTable(s, avg, fmt.Sprintf("%s in %v", status, s.Elapsed.Round(time.Millisecond))))
	case progressLog:
		for _, op := range s.Operators {
			attrs := []any{"operator", op.UID, "parallelism", op.Parallelism,
				"in", op.RecordsIn, "out", op.RecordsOut, "rate", fmt.Sprintf("%.0f/s", avg[op.UID])}
			if op.DeadLetters > 0 {
				attrs = append(attrs, "dead_letters", op.DeadLetters)
			}
			p.log.Info("summary", attrs...)
		}
	}
}

func statsTable(s runtime.Stats, rates map[string]float64, title string) string {
	var b strings.Builder
	b.WriteString(title + "\n")
	// Numbers align right; the operator column, padded here, stays left-aligned.
	w := len("OPERATOR")
	for _, op := range s.Operators {
		w = max(w, len(op.UID))
	}
	tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tPARALLELISM\tIN\tOUT\tRATE/S\t\n", w, "OPERATOR")
	for _, op := range s.Operators {
		fmt.Fprintf(tw, "%-*s\t%d\t%d\t%d\t%.0f\t\n", w, op.UID, op.Parallelism, op.RecordsIn, op.RecordsOut, rates[op.UID])
	}
	tw.Flush()
	return b.String()
}
