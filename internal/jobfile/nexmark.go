package jobfile

import (
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/streamd/streamd/internal/nexmark"
)

// nexmarkFields are the fields of a nexmark source (docs/nexmark.md).
var nexmarkFields = []string{"events", "rate", "event_rate", "base_time", "seed", "out_of_order_group_size", "watermark_lag", "watermark"}

// nexmark reads a nexmark source's fields (f: the source's mapping).
func (p *parser) nexmark(op, prefix string, line int, f map[string]*yaml.Node) *nexmark.Config {
	c := &nexmark.Config{}
	for field, dst := range map[string]*int64{"events": &c.Events, "event_rate": &c.EventRate, "base_time": &c.BaseTime, "seed": &c.Seed, "out_of_order_group_size": &c.OutOfOrderGroupSize} {
		if n := f[field]; n != nil {
			*dst, _ = p.int64(op, prefix+field, n)
		}
	}
	if n := f["rate"]; n != nil {
		c.Rate, _ = p.float(op, prefix+"rate", n)
	}
	if err := c.WithDefaults().Check(); err != nil {
		field, msg, _ := strings.Cut(err.Error(), ": ")
		at := line
		if n := f[field]; n != nil {
			at = n.Line
		}
		p.add(op, at, prefix+field, "%s", msg)
	}
	return c
}
