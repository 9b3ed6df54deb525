package jobfile

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrInvalid is matched (errors.Is) by every *Error.
var ErrInvalid = errors.New("jobfile: invalid job file")

// Problem is one reason a job file is invalid.
type Problem struct {
	Operator string // uid of the operator at fault, "" when it has none or the problem is job-wide
	Line     int    // 1-based line in the job file, 0 when unknown
	Field    string // the field's path as written in the file: "parallelism", "inputs[0].from", "source.type"
	Message  string
}

func (p Problem) String() string {
	var b strings.Builder
	switch {
	case p.Operator != "" && p.Line > 0:
		fmt.Fprintf(&b, "operator %q (line %d): ", p.Operator, p.Line)
	case p.Operator != "":
		fmt.Fprintf(&b, "operator %q: ", p.Operator)
	case p.Line > 0:
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Field != "" {
		b.WriteString(p.Field)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// Error lists every problem found in one job file, ordered by line. Its text
// has one line per problem:
//
//	jobfile: wordcount.yaml: operator "count" (line 12): inputs[0].from: unknown operator "lnes"
type Error struct {
	File     string // the job file's name as given to Load (or Options.Filename)
	Problems []Problem
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		if e.File != "" {
			lines[i] = fmt.Sprintf("jobfile: %s: %s", e.File, p)
		} else {
			lines[i] = fmt.Sprintf("jobfile: %s", p)
		}
	}
	return strings.Join(lines, "\n")
}

func (e *Error) Unwrap() error { return ErrInvalid }

func (e *Error) sort() {
	sort.SliceStable(e.Problems, func(i, j int) bool { return e.Problems[i].Line < e.Problems[j].Line })
}

// suggest returns ` (did you mean "x"?)` when one of known is close to s.
func suggest(s string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(s, k); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
