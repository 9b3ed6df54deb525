package wire

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/runtime"
)

// PrefixTask is the prefix of the subjects between the driver of a job spread
// over hosts (in the controller) and its subtasks.
const PrefixTask = "streamd.v1.task"

// TaskEventsSubject is where the hosts of attempt `attempt` of job publish
// their subtasks' events (TaskEvent) to the controller.
func TaskEventsSubject(job string, attempt int) string {
	return PrefixTask + "." + job + "." + strconv.Itoa(attempt) + ".events"
}

// TaskCommandSubject is where the controller publishes the driver's commands
// (TaskCommand) for the subtasks that host runs in attempt `attempt` of job.
func TaskCommandSubject(job string, attempt int, host string) string {
	return PrefixTask + "." + job + "." + strconv.Itoa(attempt) + ".cmd." + host
}

// TaskEvent is one subtask event; exactly one field besides Host is set.
type TaskEvent struct {
	Host string `json:"host"`
	// Seq numbers the events of one host in one attempt (1, 2, ...), like
	// TaskCommand.Seq.
	Seq           uint64                 `json:"seq,omitempty"`
	Running       *control.TaskRunning   `json:"running,omitempty"`
	EndOfData     *control.TaskEndOfData `json:"end_of_data,omitempty"`
	Finished      *control.TaskFinished  `json:"finished,omitempty"`
	Ack           *control.Ack           `json:"ack,omitempty"`
	Decline       *control.Decline       `json:"decline,omitempty"`
	TriggerFailed *control.TriggerFailed `json:"trigger_failed,omitempty"`
}

func NewTaskEvent(host string, ev control.Event) (TaskEvent, error) {
	te := TaskEvent{Host: host}
	switch e := ev.(type) {
	case control.TaskRunning:
		te.Running = &e
	case control.TaskEndOfData:
		te.EndOfData = &e
	case control.TaskFinished:
		te.Finished = &e
	case control.Ack:
		te.Ack = &e
	case control.Decline:
		te.Decline = &e
	case control.TriggerFailed:
		te.TriggerFailed = &e
	default:
		return te, fmt.Errorf("cluster: subtask event %T cannot be sent", ev)
	}
	return te, nil
}

// Event returns the control event.
func (te TaskEvent) Event() (control.Event, error) {
	switch {
	case te.Running != nil:
		return *te.Running, nil
	case te.EndOfData != nil:
		return *te.EndOfData, nil
	case te.Finished != nil:
		return *te.Finished, nil
	case te.Ack != nil:
		return *te.Ack, nil
	case te.Decline != nil:
		return *te.Decline, nil
	case te.TriggerFailed != nil:
		return *te.TriggerFailed, nil
	}
	return nil, errors.New("cluster: empty subtask event")
}

// TaskCommand is one driver command for one subtask.
type TaskCommand struct {
	Subtask control.SubtaskID `json:"subtask"`
	Command runtime.Command   `json:"command"`
	// Seq numbers the commands to one host in one attempt (1, 2, ...): a
	// command sent again after a lost answer is recognized and not applied
	// twice. 0: unnumbered. Each controller term numbers from 1 again.
	Seq uint64 `json:"seq,omitempty"`
	// Term is the sending controller's term: a host takes commands of the
	// newest term it knows only.
	Term uint64 `json:"term,omitempty"`
	// Resync (with no command): a new leader took the attempt over; the
	// host reports its subtasks' lifecycle again (running, end of data,
	// finished), as its new checkpoint coordinator has not heard them.
	Resync bool `json:"resync,omitempty"`
}
