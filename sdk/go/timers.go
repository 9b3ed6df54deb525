package streamd

import "strconv"

// The timer service and the current key (SPEC14 section 4). Keyed calls
// take the current key: the record's key in ProcessElement, the timer's key
// in OnTimer and OnProcessingTime. Elsewhere there is none, and a keyed call
// fails the subtask.

// ProcessingTimeHandler is implemented by an operator that handles
// processing-time timers; Base implements it with a no-op. Without it, due
// processing-time timers are dropped.
type ProcessingTimeHandler interface {
	// OnProcessingTime is called for each processing-time timer whose time
	// ts the host's processing time reached, in (ts, key) order, between
	// record batches. key is the timer's key (the current key), valid only
	// during the call. The timer is removed before the call. It may Emit.
	// Timers do not fire after Finish.
	OnProcessingTime(ts int64, key []byte) error
}

func (Base) OnProcessingTime(int64, []byte) error { return nil }

// CurrentKey returns the current key: the record's key in ProcessElement,
// the timer's key in OnTimer and OnProcessingTime, nil elsewhere. It is valid
// only during the call.
func CurrentKey() []byte {
	if !cur.hasKey() {
		return nil
	}
	return curKey
}

// currentKey returns the current key for a keyed call by what, or fails the
// subtask when there is none.
func currentKey(what string) []byte {
	if !cur.hasKey() {
		Fail("streamd: " + what + ": no current key in " + cur.String() +
			" (keyed state and timers work in ProcessElement, OnTimer and OnProcessingTime)")
	}
	if len(curKey) == 0 {
		Fail("streamd: " + what + ": the current key is empty in " + cur.String() +
			" (keyed state and timers need keyed records: read the stream through a partition: hash edge)")
	}
	return curKey
}

// RegisterEventTimeTimer registers an event-time timer for the current key
// that fires OnTimer(ts, key) once the watermark reaches ts. Registering the
// same (key, ts) twice keeps one timer; a timer at or below the current
// watermark fires at the next watermark advance.
func RegisterEventTimeTimer(ts int64) {
	hostTimerRegister(currentKey("RegisterEventTimeTimer("+strconv.FormatInt(ts, 10)+")"), ts)
}

// DeleteEventTimeTimer deletes the event-time timer (current key, ts) if
// there is one.
func DeleteEventTimeTimer(ts int64) {
	hostTimerDelete(currentKey("DeleteEventTimeTimer("+strconv.FormatInt(ts, 10)+")"), ts)
}

// RegisterProcessingTimeTimer registers a processing-time timer for the
// current key that fires OnProcessingTime(ts, key) once the host's
// processing time (milliseconds since the Unix epoch) reaches ts. Timers are
// keyed state: checkpointed and restored; an overdue restored timer fires
// soon after Open.
func RegisterProcessingTimeTimer(ts int64) {
	hostPTimerRegister(currentKey("RegisterProcessingTimeTimer("+strconv.FormatInt(ts, 10)+")"), ts)
}

// DeleteProcessingTimeTimer deletes the processing-time timer (current key,
// ts) if there is one.
func DeleteProcessingTimeTimer(ts int64) {
	hostPTimerDelete(currentKey("DeleteProcessingTimeTimer("+strconv.FormatInt(ts, 10)+")"), ts)
}

// CurrentProcessingTime returns the host's processing time in milliseconds
// since the Unix epoch. It needs allow_clock: true on the operator in the job
// file; without it the call fails the subtask.
func CurrentProcessingTime() int64 { return hostProcessingTime() }

// InputWatermark returns the current watermark of input (0-based): the
// minimum over that input's channels, idle channels excluded, MinWatermark
// before any. An input out of range fails the subtask.
func InputWatermark(input int) int64 { return hostInputWatermark(int32(input)) }
