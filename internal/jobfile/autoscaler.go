package jobfile

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/streamd/streamd/control"
)

// AutoscalerSettings is the job file's autoscaler section: the controller
// rescales each operator on its backlog and busy time (control.Autoscaler),
// through a savepoint. Off unless Enabled.
type AutoscalerSettings struct {
	Enabled bool `json:"enabled"`
	// MaxParallelism bounds every operator (0: its max_parallelism, the
	// key groups); Operators bounds single ones (uid -> max).
	MaxParallelism      int            `json:"max_parallelism,omitempty"`
	Operators           map[string]int `json:"operators,omitempty"`
	TargetUtilization   float64        `json:"target_utilization"`
	UtilizationBoundary float64        `json:"utilization_boundary"`
	MetricsWindow       time.Duration  `json:"metrics_window"`
	Stabilization       time.Duration  `json:"stabilization"`
	Cooldown            time.Duration  `json:"cooldown"`
	CatchUp             time.Duration  `json:"catch_up"`
	MaxScaleDown        float64        `json:"max_scale_down"`
}

// DefaultAutoscaler is the autoscaler section's defaults (off).
func DefaultAutoscaler() AutoscalerSettings {
	return AutoscalerSettings{TargetUtilization: control.DefaultTargetUtilization, UtilizationBoundary: control.DefaultUtilBoundary,
		MetricsWindow: control.DefaultMetricsWindow, Stabilization: control.DefaultStabilization, Cooldown: control.DefaultCooldown,
		CatchUp: control.DefaultCatchUp, MaxScaleDown: control.DefaultMaxScaleDown}
}

// Control is the settings as control.Autoscaler takes them.
func (a AutoscalerSettings) Control() control.AutoscaleConfig {
	return control.AutoscaleConfig{TargetUtilization: a.TargetUtilization, Boundary: a.UtilizationBoundary, MetricsWindow: a.MetricsWindow,
		Stabilization: a.Stabilization, Cooldown: a.Cooldown, CatchUp: a.CatchUp, MaxScaleDown: a.MaxScaleDown}
}

// MaxOf is the most the autoscaler runs operator v at.
func (a AutoscalerSettings) MaxOf(uid string, keyGroups int) int {
	m := keyGroups
	if a.MaxParallelism > 0 {
		m = min(m, a.MaxParallelism)
	}
	if o, ok := a.Operators[uid]; ok && o > 0 {
		m = min(keyGroups, o)
	}
	return max(m, 1)
}

// String is the settings as `streamd validate` prints them.
func (a AutoscalerSettings) String() string {
	if !a.Enabled {
		return "off"
	}
	s := fmt.Sprintf("on, target utilization %g +- %g, metrics window %v, stabilization %v, cooldown %v, catch-up %v, scale-down at most %g",
		a.TargetUtilization, a.UtilizationBoundary, a.MetricsWindow, a.Stabilization, a.Cooldown, a.CatchUp, a.MaxScaleDown)
	if a.MaxParallelism > 0 {
		s += fmt.Sprintf(", max parallelism %d", a.MaxParallelism)
	}
	return s
}

var (
	autoscalerFields   = []string{"enabled", "max_parallelism", "operators", "target_utilization", "utilization_boundary", "metrics_window", "stabilization", "cooldown", "catch_up", "max_scale_down"}
	autoscalerOpFields = []string{"max_parallelism"}
)

// autoscaler reads the autoscaler section (nil: none, off); ops are the
// job's operators (their uids, key groups and min parallelism bound the
// section's), checkpoint whether the job checkpoints (a rescale goes
// through a savepoint).
func (p *parser) autoscaler(n *yaml.Node, ops []*operator, checkpoint bool) *AutoscalerSettings {
	const prefix = "autoscaler."
	if n == nil {
		return nil
	}
	a := DefaultAutoscaler()
	if n.Kind != yaml.MappingNode {
		p.add("", n.Line, "autoscaler", "want a mapping like {enabled: true, max_parallelism: 8}")
		return nil
	}
	f := p.fields("", prefix, n, autoscalerFields)
	if x := f["enabled"]; x != nil {
		a.Enabled = p.bool("", prefix+"enabled", x)
		if a.Enabled && !checkpoint {
			p.add("", x.Line, prefix+"enabled", "autoscaling needs a checkpoint section: a rescale stops the job with a savepoint and restores it")
		}
	}
	p.intAtLeast(f, prefix, "max_parallelism", 1, "", &a.MaxParallelism)
	p.fraction(f, prefix, "target_utilization", false, true, &a.TargetUtilization)
	p.fraction(f, prefix, "utilization_boundary", true, false, &a.UtilizationBoundary)
	p.fraction(f, prefix, "max_scale_down", false, false, &a.MaxScaleDown)
	p.durationAtLeast(f, prefix, "metrics_window", time.Millisecond, "must be at least 1ms", &a.MetricsWindow)
	p.durationAtLeast(f, prefix, "stabilization", 0, "must not be negative", &a.Stabilization)
	p.durationAtLeast(f, prefix, "cooldown", 0, "must not be negative", &a.Cooldown)
	p.durationAtLeast(f, prefix, "catch_up", time.Millisecond, "must be at least 1ms", &a.CatchUp)
	byUID := map[string]*operator{}
	var uids []string
	for _, op := range ops {
		byUID[op.vertex.UID] = op
		uids = append(uids, op.vertex.UID)
	}
	if x := f["operators"]; x != nil {
		if x.Kind != yaml.MappingNode {
			p.add("", x.Line, prefix+"operators", "want a mapping of operator uids, like {sink: {max_parallelism: 1}}")
		} else {
			a.Operators = map[string]int{}
			for i := 0; i+1 < len(x.Content); i += 2 {
				k, v := resolve(x.Content[i]), resolve(x.Content[i+1])
				field := prefix + "operators." + k.Value
				op := byUID[k.Value]
				if op == nil {
					p.add("", k.Line, field, "no operator %q%s", k.Value, suggest(k.Value, uids))
					continue
				}
				if v.Kind != yaml.MappingNode {
					p.add(k.Value, v.Line, field, "want a mapping like {max_parallelism: 4}")
					continue
				}
				of := p.fields(k.Value, field+".", v, autoscalerOpFields)
				if m := of["max_parallelism"]; m != nil {
					if x, ok := p.int(k.Value, field+".max_parallelism", m); ok {
						if x < max(op.vertex.MinParallelism, 1) || x > op.vertex.MaxParallelism {
							p.add(k.Value, m.Line, field+".max_parallelism", "must be between its min_parallelism %d and its max_parallelism %d, got %d",
								max(op.vertex.MinParallelism, 1), op.vertex.MaxParallelism, x)
						}
						a.Operators[k.Value] = x
					}
				}
			}
		}
	}
	if a.TargetUtilization-a.UtilizationBoundary <= 0 && f["utilization_boundary"] != nil {
		p.add("", f["utilization_boundary"].Line, prefix+"utilization_boundary", "%g leaves no utilization low enough to scale down at target %g (want below it)",
			a.UtilizationBoundary, a.TargetUtilization)
	}
	return &a
}

// fraction sets *dst from field key of f, if present: a number in (0, 1)
// (zero: 0 allowed, one: 1 allowed).
func (p *parser) fraction(f map[string]*yaml.Node, prefix, key string, zero, one bool, dst *float64) {
	x := f[key]
	if x == nil {
		return
	}
	v, ok := p.float("", prefix+key, x)
	if !ok {
		return
	}
	lo, hi := "0 <", "< 1"
	if zero {
		lo = "0 <="
	}
	if one {
		hi = "<= 1"
	}
	if v < 0 || (v == 0 && !zero) || v > 1 || (v == 1 && !one) {
		p.add("", x.Line, prefix+key, "must be %s x %s, got %g", lo, hi, v)
		return
	}
	*dst = v
}
