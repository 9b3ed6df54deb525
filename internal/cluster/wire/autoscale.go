package wire

import "time"

// AutoscalerStatus is the autoscaler of a job (the controller's
// internal/cluster/autoscale.go): its settings, what it waits
// for now and its latest decisions.
type AutoscalerStatus struct {
	Settings  string                    `json:"settings"`
	Hold      string                    `json:"hold,omitempty"` // why it rescales nothing now
	Targets   map[string]int            `json:"targets,omitempty"`
	Decisions []AutoscaleDecisionStatus `json:"decisions,omitempty"`
}

// AutoscaleDecisionStatus is one operator's rescale decided by the
// autoscaler.
type AutoscaleDecisionStatus struct {
	Time     time.Time `json:"time"`
	Operator string    `json:"operator"`
	From     int       `json:"from"`
	To       int       `json:"to"`
	Reason   string    `json:"reason"`
	// Outcome: "rescaling" while the job stops with a savepoint, then
	// "rescaled", or why not ("not rescaled: ...").
	Outcome string `json:"outcome"`
}
