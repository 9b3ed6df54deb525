package jobfile

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// onError parses on_error, dead_letter and max_dead_letters of a wasm
// operator; nil for on_error fail (or absent).
func (p *parser) onError(op, prefix string, f map[string]*yaml.Node) *OnError {
	mode := OnErrorFail
	if c := f["on_error"]; c != nil {
		mode = p.str(op, prefix+"on_error", c)
		if !contains(OnErrorModes, mode) {
			if mode != "" || c.Tag != "!!null" {
				p.add(op, c.Line, prefix+"on_error", "unknown mode %q (want %s)", mode, orList(OnErrorModes))
			}
			return nil
		}
	}
	dl, max := f["dead_letter"], f["max_dead_letters"]
	if mode == OnErrorFail {
		if dl != nil {
			p.add(op, dl.Line, prefix+"dead_letter", "only with on_error: dead_letter (this operator fails on a failing record)")
		}
		if max != nil {
			p.add(op, max.Line, prefix+"max_dead_letters", "only with on_error: skip or dead_letter (this operator fails on the first failing record)")
		}
		return nil
	}
	oe := &OnError{Mode: mode}
	switch {
	case mode == OnErrorDeadLetter && dl == nil:
		p.add(op, f["on_error"].Line, prefix+"dead_letter", "missing: on_error dead_letter sends the failing records to a dead_letter sink, e.g. {type: file, path: dead/}")
	case mode == OnErrorSkip && dl != nil:
		p.add(op, dl.Line, prefix+"dead_letter", "only with on_error: dead_letter (on_error skip drops the failing records)")
	case dl != nil:
		field := prefix + "dead_letter"
		if oe.DeadLetter = p.sinkAt(op, field+".", dl); oe.DeadLetter != nil && oe.DeadLetter.Type != "" {
			if known, ok, which := sinkTakesDeadLetters(oe.DeadLetter.Type); known && !ok {
				p.add(op, dl.Line, field+".type", "a %s sink cannot take dead letters: they are written exactly once, by a %s sink", oe.DeadLetter.Type, orList(which))
			}
		}
	}
	if max != nil {
		l, err := ParseDeadLetterLimit(max)
		if err != nil {
			p.add(op, max.Line, prefix+"max_dead_letters", "%v", err)
		}
		oe.Max = l
	}
	return oe
}

// ParseDeadLetterLimit reads max_dead_letters: a count ("100": at most 100
// failed records per subtask) or a rate ("100/1m": at most 100 within any
// minute; the duration is Go's, or a bare unit: "100/s").
func ParseDeadLetterLimit(n *yaml.Node) (DeadLetterLimit, error) {
	const want = `want a count like 100 or a rate like 100/1m`
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return DeadLetterLimit{}, fmt.Errorf("%s, got %s", want, describe(n))
	}
	count, per, rate := strings.Cut(strings.TrimSpace(n.Value), "/")
	c, err := strconv.ParseInt(strings.TrimSpace(count), 10, 64)
	if err != nil || c < 1 {
		return DeadLetterLimit{}, fmt.Errorf("%q: the count must be a whole number of at least 1; %s", n.Value, want)
	}
	l := DeadLetterLimit{Count: c}
	if rate {
		per = strings.TrimSpace(per)
		if per == "s" || per == "m" || per == "h" {
			per = "1" + per
		}
		d, err := time.ParseDuration(per)
		if err != nil || d <= 0 {
			return DeadLetterLimit{}, fmt.Errorf("%q: the window %q is not a positive duration like 1m or 30s; %s", n.Value, per, want)
		}
		l.Per = d
	}
	return l, nil
}

// checkDeadLetterPaths refuses a file dead-letter sink writing the directory
// of a file sink or of another dead-letter sink: their part files would
// have the same names.
func (p *parser) checkDeadLetterPaths(ops []*operator) {
	owner := map[string]string{} // directory -> the field that writes it
	for _, op := range ops {
		if s, ok := op.vertex.Spec.(*SinkSpec); ok && s != nil && s.Type == "file" && s.Path != "" {
			owner[s.Path] = fmt.Sprintf("the sink of operator %q", op.vertex.UID)
		}
	}
	for _, op := range ops {
		ws, ok := op.vertex.Spec.(*WasmSpec)
		if !ok || ws.OnError == nil || ws.OnError.DeadLetter == nil {
			continue
		}
		dl := ws.OnError.DeadLetter
		if dl.Type != "file" || dl.Path == "" {
			continue
		}
		if prev, dup := owner[dl.Path]; dup {
			p.add(op.vertex.UID, op.lines["dead_letter"], "dead_letter.path", "%s is also written by %s: give the dead letters a directory of their own", dl.Path, prev)
			continue
		}
		owner[dl.Path] = fmt.Sprintf("the dead_letter of operator %q", op.vertex.UID)
	}
}
