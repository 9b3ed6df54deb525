package streamdtest

import (
	"bytes"
	"encoding/binary"
	"maps"
	"slices"

	"github.com/streamd/streamd/sdk/go/internal/hook"
)

// Snapshot is the state of one or more subtasks at a checkpoint: keyed
// state with its expiries, both kinds of timers, and the operator list
// state each subtask wrote in SnapshotState. Restore it with
// Options.Restore, at the parallelism it was taken at or (after Merge of
// every subtask's snapshot) at another.
type Snapshot struct {
	ID             int64
	processingTime int64
	plain          map[string][]byte // name "\x00" key -> value
	mstate         map[string]map[string]*entry
	timers         []timerKey
	ptimers        []timerKey
	parts          []snapPart // operator list state per old subtask
}

type snapPart struct {
	subtask, parallelism int
	lists                map[string]*listState
}

// Snapshot calls SnapshotState(id) and returns the subtask's snapshot, as a
// checkpoint barrier does. Expired state is left out (the memory backend
// drops it when it writes a snapshot). When SnapshotState fails, the
// returned snapshot is empty and Err returns the failure.
func (h *Harness) Snapshot(id int64) Snapshot {
	h.lists = map[string]*listState{}
	if err := h.checkOpen("Snapshot"); err != nil {
		panic(err)
	}
	if err := h.call("SnapshotState", func() int32 { return hook.Guest.Snapshot(id) }); err != nil {
		return Snapshot{ID: id}
	}
	x := (*host)(h)
	s := Snapshot{ID: id, processingTime: h.now, plain: maps.Clone(h.plain), mstate: map[string]map[string]*entry{}}
	for p, m := range h.mstate {
		for uk, e := range m {
			if !x.live(e) {
				continue
			}
			c := e.clone()
			if c.list {
				c.elems = slices.DeleteFunc(c.elems, func(el elem) bool { return !x.alive(el.expiry) })
			}
			if s.mstate[p] == nil {
				s.mstate[p] = map[string]*entry{}
			}
			s.mstate[p][uk] = c
		}
	}
	for t := range h.timers {
		s.timers = append(s.timers, t)
	}
	for t := range h.ptimers {
		s.ptimers = append(s.ptimers, t)
	}
	sortTimers(s.timers)
	sortTimers(s.ptimers)
	lists := map[string]*listState{}
	for n, l := range h.lists {
		lists[n] = &listState{mode: l.mode, entries: slices.Clone(l.entries)}
	}
	s.parts = []snapPart{{subtask: h.opts.Subtask, parallelism: h.opts.Parallelism, lists: lists}}
	return s
}

// Merge combines the snapshots of the subtasks of one checkpoint into one,
// to restore them at another parallelism.
func Merge(snaps ...Snapshot) Snapshot {
	m := Snapshot{plain: map[string][]byte{}, mstate: map[string]map[string]*entry{}}
	for _, s := range snaps {
		m.ID = max(m.ID, s.ID)
		m.processingTime = max(m.processingTime, s.processingTime)
		maps.Copy(m.plain, s.plain)
		for p, e := range s.mstate {
			if m.mstate[p] == nil {
				m.mstate[p] = map[string]*entry{}
			}
			maps.Copy(m.mstate[p], e)
		}
		m.timers = append(m.timers, s.timers...)
		m.ptimers = append(m.ptimers, s.ptimers...)
		m.parts = append(m.parts, s.parts...)
	}
	sortTimers(m.timers)
	sortTimers(m.ptimers)
	slices.SortStableFunc(m.parts, func(a, b snapPart) int { return a.subtask - b.subtask })
	return m
}

// owns reports whether the harness's subtask owns key.
func (h *Harness) owns(key []byte) bool {
	kg := KeyGroup(key, h.opts.MaxParallelism)
	return kg >= h.kg0 && kg <= h.kg1
}

// restore loads the share of s that belongs to the harness's subtask.
func (h *Harness) restore(s *Snapshot) {
	h.now = max(h.now, s.processingTime)
	for k, v := range s.plain {
		if i := bytes.IndexByte([]byte(k), 0); i >= 0 && h.owns([]byte(k[i+1:])) {
			h.plain[k] = v
		}
	}
	for p, m := range s.mstate {
		if !h.owns(keyOfPrefix(p)) {
			continue
		}
		c := map[string]*entry{}
		for uk, e := range m {
			c[uk] = e.clone()
		}
		h.mstate[p] = c
	}
	for _, t := range s.timers {
		if h.owns([]byte(t.key)) {
			h.timers[t] = true
		}
	}
	for _, t := range s.ptimers {
		if h.owns([]byte(t.key)) {
			h.ptimers[t] = true
		}
	}
	h.restoreLists(s.parts)
}

// keyOfPrefix returns the key embedded in a structured-state prefix
// ("\x00" name "\x00" u32be len key, key, u32be len ns, ns).
func keyOfPrefix(p string) []byte {
	b := []byte(p[1:])
	i := bytes.IndexByte(b, 0)
	b = b[i+1:]
	n := binary.BigEndian.Uint32(b)
	return b[4 : 4+n]
}

// restoreLists redistributes operator list state as the host does
// (internal/checkpoint/reassign.go): split round robin over the entries of
// all old subtasks in order (each subtask keeps its own at the same
// parallelism), union to everyone, broadcast one copy each.
func (h *Harness) restoreLists(parts []snapPart) {
	p, sub := h.opts.Parallelism, h.opts.Subtask
	names := map[string]int32{}
	for _, part := range parts {
		for n, l := range part.lists {
			names[n] = l.mode
		}
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		mode := names[name]
		var mine [][]byte
		switch mode {
		case 0: // split
			k := 0
			for j, part := range parts {
				l := part.lists[name]
				if l == nil {
					continue
				}
				for _, e := range l.entries {
					i := k % p
					if len(parts) == p {
						i = j
					}
					if i == sub {
						mine = append(mine, e)
					}
					k++
				}
			}
		case 1: // union
			for _, part := range parts {
				if l := part.lists[name]; l != nil {
					mine = append(mine, l.entries...)
				}
			}
		default: // broadcast
			if len(parts) > 0 {
				if l := parts[sub%len(parts)].lists[name]; l != nil {
					mine = l.entries
				}
			}
		}
		h.restored[name] = &listState{mode: mode, entries: mine}
	}
}
