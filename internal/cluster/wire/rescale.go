package wire

import (
	"time"
)

// RescaleStatus is one rescale of a job by the adaptive scheduler.
type RescaleStatus struct {
	Time    time.Time `json:"time"`
	From    int       `json:"from"` // the parallelism (slots) it ran on, or was to run on
	To      int       `json:"to"`
	Reason  string    `json:"reason"`
	Attempt int       `json:"attempt"`           // its first attempt at To
	Restore string    `json:"restore,omitempty"` // the savepoint of a scale-up; else the latest checkpoint
}
