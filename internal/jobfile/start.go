package jobfile

import (
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/connector"
)

// Start positions of a nats source (source.start, streamd deploy --start):
// connector's, under the names the job-file code has used.
const (
	StartFirst = connector.StartFirst
	StartNew   = connector.StartNew
	StartSeq   = connector.StartSeq
	StartTime  = connector.StartTime
)

// NATSStart is where a nats source starts reading at its first start.
type NATSStart = connector.NATSStart

// ParseNATSStart reads first, new, seq:N or time:RFC3339; "" is first.
func ParseNATSStart(s string) (NATSStart, error) { return connector.ParseNATSStart(s) }

// PinNewStart makes every nats source of g that starts at new start at
// time:at instead, the job's first start: so a restart before the first
// checkpoint reads what was stored since that first start, not only what
// comes after the restart. The vertices get pinned copies of their source
// specs (the specs themselves are not changed).
func PinNewStart(g *control.JobGraph, at time.Time) {
	for _, v := range g.Vertices {
		if s, ok := v.Spec.(*SourceSpec); ok {
			v.Spec = s.PinNewStart(at)
		}
	}
}
