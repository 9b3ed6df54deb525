package connector

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Start positions of a nats source (source.start, streamd deploy --start).
const (
	StartFirst = "first" // the stream's first message (the default)
	StartNew   = "new"   // the messages stored after the source first starts
	StartSeq   = "seq"   // seq:N, the message with stream sequence N and later
	StartTime  = "time"  // time:RFC3339, the first message stored at or after the time
)

// NATSStart is where a nats source starts reading at its first start; a
// restored source resumes from its checkpointed position instead.
type NATSStart struct {
	Kind string    // StartFirst, StartNew, StartSeq or StartTime
	Seq  uint64    // StartSeq: the first stream sequence, at least 1
	Time time.Time // StartTime
}

// ParseNATSStart reads first, new, seq:N or time:RFC3339; "" is first.
func ParseNATSStart(s string) (NATSStart, error) {
	switch s {
	case "", StartFirst:
		return NATSStart{Kind: StartFirst}, nil
	case StartNew:
		return NATSStart{Kind: StartNew}, nil
	}
	kind, arg, _ := strings.Cut(s, ":")
	switch kind {
	case StartSeq:
		n, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || n < 1 {
			return NATSStart{}, fmt.Errorf("%q: seq:N needs a stream sequence N of at least 1", s)
		}
		return NATSStart{Kind: StartSeq, Seq: n}, nil
	case StartTime:
		t, err := time.Parse(time.RFC3339Nano, arg)
		if err != nil {
			return NATSStart{}, fmt.Errorf("%q: time:T needs an RFC 3339 time T like 2025-01-02T15:04:05Z", s)
		}
		return NATSStart{Kind: StartTime, Time: t}, nil
	}
	return NATSStart{}, fmt.Errorf("%q: want first, new, seq:N or time:RFC3339", s)
}

// String is the start as ParseNATSStart reads it.
func (s NATSStart) String() string {
	switch s.Kind {
	case StartSeq:
		return StartSeq + ":" + strconv.FormatUint(s.Seq, 10)
	case StartTime:
		return StartTime + ":" + s.Time.Format(time.RFC3339Nano)
	case "":
		return StartFirst
	}
	return s.Kind
}

// PinNewStart returns s, or, for a nats source that starts at new, a copy
// that starts at time:at.
func (s *SourceSpec) PinNewStart(at time.Time) *SourceSpec {
	if s.Type != "nats" || s.Start != StartNew {
		return s
	}
	pinned := *s
	pinned.Start = NATSStart{Kind: StartTime, Time: at.UTC()}.String()
	return &pinned
}
