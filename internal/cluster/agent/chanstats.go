package agent

import "github.com/streamd/streamd/dataplane/natsch"

// SenderStats adds up the counters of the NATS channel senders this executor
// made for jobs spread over hosts (messages, bytes, credit waits: how often
// a slow receiver on another host held a sender back).
func (e *LocalExecutor) SenderStats() natsch.SenderStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out natsch.SenderStats
	for _, t := range e.transports {
		s := t.SenderStats()
		out.Messages += s.Messages
		out.Bytes += s.Bytes
		out.CreditWaits += s.CreditWaits
		out.CreditRequests += s.CreditRequests
		out.Parts += s.Parts
		out.MaxInFlight = max(out.MaxInFlight, s.MaxInFlight)
	}
	return out
}
