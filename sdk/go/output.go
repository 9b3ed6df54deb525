package streamd

import "strconv"

// Side outputs and the operator's own watermarks (SPEC14 section 3).

// sideFrame is the pending output frame of one side output.
type sideFrame struct {
	name  string
	frame outFrame
}

var (
	sides []*sideFrame // in order of first use; few per operator
	// flushSides is set by the first EmitTo, so that a module that never
	// emits to a side output does not import emit_to.
	flushSides func()
)

// EmitTo sends a record to the operator's side output called output
// (letters, digits, '-' and '_', 1 to 128 of them), which the job file reads
// as OP.output. Like Emit it copies key and value and is allowed in
// ProcessElement, OnTimer, OnProcessingTime, OnWatermark, EndInput and
// Finish. A side output nobody reads drops its records (the host counts
// them).
func EmitTo(output string, key, value []byte, ts int64) {
	s := sideFor("EmitTo", output)
	s.frame.add(key, value, ts)
	s.flushIfFull()
}

// sideFor is the frame of side output output for an emit (what), which
// fails the subtask outside the phases that may emit.
func sideFor(what, output string) *sideFrame {
	if !emitOK {
		emitOutside(what + "(" + strconv.Quote(output) + ")")
	}
	return side(output)
}

// flushIfFull sends the frame when it reached the flush threshold.
func (s *sideFrame) flushIfFull() {
	if s.frame.size() >= flushThreshold {
		hostEmitTo(s.name, s.frame.frame())
		s.frame.reset()
	}
}

func side(name string) *sideFrame {
	for _, s := range sides {
		if s.name == name {
			return s
		}
	}
	if err := checkOutputName(name); err != "" {
		Fail("streamd: EmitTo: side output name " + strconv.Quote(name) + " " + err)
	}
	s := &sideFrame{name: name}
	sides = append(sides, s)
	flushSides = flushSideFrames
	return s
}

// checkOutputName returns why name is not a valid side output name, or "".
func checkOutputName(name string) string {
	if len(name) == 0 || len(name) > 128 {
		return "must have 1 to 128 characters"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "may hold only letters, digits, '-' and '_'"
		}
	}
	return ""
}

func flushSideFrames() {
	for _, s := range sides {
		if f := s.frame.frame(); f != nil {
			hostEmitTo(s.name, f)
			s.frame.reset()
		}
	}
}

func resetSides() {
	for _, s := range sides {
		s.frame.reset()
	}
}

// EmitWatermark makes ts the operator's output watermark. From the first
// call on, the operator's watermark is its own: the host no longer forwards
// the operator's input watermark (it still sends MaxWatermark after Finish
// at the end of all inputs). A ts not above the last emitted one is ignored.
// The records emitted before the call are sent before the watermark.
//
// EmitWatermark is allowed in Open, ProcessElement, OnWatermark, OnTimer,
// OnProcessingTime and EndInput.
func EmitWatermark(ts int64) {
	switch cur {
	case phaseOpen, phaseProcess, phaseWatermark, phaseTimer, phaseProcessingTime, phaseEndInput:
	default:
		Fail("streamd: EmitWatermark called in " + cur.String() +
			": watermarks may be emitted only in Open, ProcessElement, OnWatermark, OnTimer, OnProcessingTime and EndInput")
	}
	flush()
	hostEmitWatermark(ts)
}
