package streamd

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"time"
)

// Windows (SPEC14 section 4), built on keyed state and timers: the contents
// of a window live in the namespace of that window (state
// "streamd.window.contents"), session windows keep the set of a key's
// windows in map state "streamd.window.sessions", and each window has a
// timer at its MaxTimestamp (it fires) and one at MaxTimestamp+lateness
// (its state is removed). The key of a record is its window key: read the
// stream through a partition: hash edge.
//
//	streamd.Register(streamd.Window(
//		streamd.TumblingEventTimeWindows(time.Minute, 0),
//		streamd.Int64,
//		streamd.ReduceWindow(func(a, b int64) int64 { return a + b }),
//		streamd.AllowedLateness(10*time.Second),
//		streamd.LateOutput("late"),
//	))

// TimeWindow is the time interval [Start, End) in milliseconds.
type TimeWindow struct{ Start, End int64 }

// MaxTimestamp is the last millisecond of the window, End-1: the time the
// window fires at and the timestamp of its output.
func (w TimeWindow) MaxTimestamp() int64 { return w.End - 1 }

func (w TimeWindow) String() string {
	return "[" + strconv.FormatInt(w.Start, 10) + ", " + strconv.FormatInt(w.End, 10) + ")"
}

// intersects is Flink's TimeWindow.intersects: windows that overlap or touch.
func (w TimeWindow) intersects(o TimeWindow) bool { return w.Start <= o.End && w.End >= o.Start }

func (w TimeWindow) cover(o TimeWindow) TimeWindow {
	return TimeWindow{min(w.Start, o.Start), max(w.End, o.End)}
}

// appendWindow appends the namespace of w: start and end as 8 bytes
// big-endian with the sign bit flipped, so namespaces sort by start.
func appendWindow(b []byte, w TimeWindow) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(w.Start)^(1<<63))
	return binary.BigEndian.AppendUint64(b, uint64(w.End)^(1<<63))
}

func parseWindow(b []byte) (TimeWindow, bool) {
	if len(b) != 16 {
		return TimeWindow{}, false
	}
	return TimeWindow{int64(binary.BigEndian.Uint64(b) ^ (1 << 63)), int64(binary.BigEndian.Uint64(b[8:]) ^ (1 << 63))}, true
}

// --- assigners ---------------------------------------------------------------

type assignerKind uint8

const (
	tumbling assignerKind = iota
	sliding
	session
)

// WindowAssigner puts each record into windows: tumbling, sliding or session
// windows over event time (the record's timestamp) or processing time (the
// host's clock when the record arrives; needs allow_clock: true).
type WindowAssigner struct {
	kind           assignerKind
	processingTime bool
	size, slide    int64 // ms; slide == size for tumbling
	offset, gap    int64
	err            string
	// The clock and timers of the assigner's time; set by the constructors,
	// so that an event-time module does not import processing_time.
	now            func() int64
	register, drop func(ts int64)
}

// timeDomain is event or processing time: the clock and timers of one.
type timeDomain struct {
	processingTime bool
	now            func() int64
	register, drop func(ts int64)
}

func eventTime() timeDomain {
	return timeDomain{false, CurrentWatermark, RegisterEventTimeTimer, DeleteEventTimeTimer}
}

func processingTime() timeDomain {
	return timeDomain{true, CurrentProcessingTime, RegisterProcessingTimeTimer, DeleteProcessingTimeTimer}
}

func (a *WindowAssigner) setTime(d timeDomain) {
	a.processingTime, a.now, a.register, a.drop = d.processingTime, d.now, d.register, d.drop
}

func millis(what string, d time.Duration, a *WindowAssigner) int64 {
	if d%time.Millisecond != 0 && a.err == "" {
		a.err = what + " " + d.String() + " is not a whole number of milliseconds"
	}
	return d.Milliseconds()
}

func fixed(kind assignerKind, pt timeDomain, size, slide, offset time.Duration, name string) WindowAssigner {
	a := WindowAssigner{kind: kind}
	a.setTime(pt)
	a.size = millis("size", size, &a)
	a.slide = millis("slide", slide, &a)
	a.offset = millis("offset", offset, &a)
	switch {
	case a.err != "":
	case a.size <= 0:
		a.err = "size " + size.String() + " is not positive"
	case a.slide <= 0:
		a.err = "slide " + slide.String() + " is not positive"
	case a.offset >= a.slide || a.offset <= -a.slide:
		a.err = "offset " + offset.String() + " is not smaller than " + map[bool]string{true: "the size", false: "the slide"}[kind == tumbling]
	}
	if a.err != "" {
		a.err = name + ": " + a.err
	}
	return a
}

func sessions(pt timeDomain, gap time.Duration, name string) WindowAssigner {
	a := WindowAssigner{kind: session}
	a.setTime(pt)
	a.gap = millis("gap", gap, &a)
	if a.err == "" && a.gap <= 0 {
		a.err = "gap " + gap.String() + " is not positive"
	}
	if a.err != "" {
		a.err = name + ": " + a.err
	}
	return a
}

// TumblingEventTimeWindows assigns each record to the window of size that
// holds its timestamp; windows start at offset + k*size.
func TumblingEventTimeWindows(size, offset time.Duration) WindowAssigner {
	return fixed(tumbling, eventTime(), size, size, offset, "TumblingEventTimeWindows")
}

// SlidingEventTimeWindows assigns each record to every window of size that
// holds its timestamp; windows start every slide.
func SlidingEventTimeWindows(size, slide time.Duration) WindowAssigner {
	return fixed(sliding, eventTime(), size, slide, 0, "SlidingEventTimeWindows")
}

// EventTimeSessionWindows gives each record the window [ts, ts+gap) and
// merges the windows of a key that overlap or touch: a session ends after
// gap without records.
func EventTimeSessionWindows(gap time.Duration) WindowAssigner {
	return sessions(eventTime(), gap, "EventTimeSessionWindows")
}

// TumblingProcessingTimeWindows is TumblingEventTimeWindows over the
// processing time at which records arrive.
func TumblingProcessingTimeWindows(size, offset time.Duration) WindowAssigner {
	return fixed(tumbling, processingTime(), size, size, offset, "TumblingProcessingTimeWindows")
}

// SlidingProcessingTimeWindows is SlidingEventTimeWindows over processing time.
func SlidingProcessingTimeWindows(size, slide time.Duration) WindowAssigner {
	return fixed(sliding, processingTime(), size, slide, 0, "SlidingProcessingTimeWindows")
}

// ProcessingTimeSessionWindows is EventTimeSessionWindows over processing time.
func ProcessingTimeSessionWindows(gap time.Duration) WindowAssigner {
	return sessions(processingTime(), gap, "ProcessingTimeSessionWindows")
}

// assign appends the windows of ts to dst (sliding: latest first, as Flink).
func (a *WindowAssigner) assign(dst []TimeWindow, ts int64) ([]TimeWindow, error) {
	if a.kind == session {
		if ts > math.MaxInt64-a.gap {
			return dst, errors.New("window: timestamp " + strconv.FormatInt(ts, 10) + " is too large for a session gap of " + strconv.FormatInt(a.gap, 10) + " ms")
		}
		return append(dst, TimeWindow{ts, ts + a.gap}), nil
	}
	rem := (ts - a.offset) % a.slide
	if rem < 0 {
		rem += a.slide
	}
	last := ts - rem
	if last > math.MaxInt64-a.size {
		return dst, errors.New("window: timestamp " + strconv.FormatInt(ts, 10) + " is too large for windows of " + strconv.FormatInt(a.size, 10) + " ms")
	}
	for start := last; start > ts-a.size; start -= a.slide {
		dst = append(dst, TimeWindow{start, start + a.size})
	}
	return dst, nil
}

// --- window functions -----------------------------------------------------------

// WindowOutput emits the result of a window: the key is the window's key
// and the timestamp the window's MaxTimestamp.
type WindowOutput struct {
	key []byte
	ts  int64
}

// Emit sends value downstream as a result of the window.
func (o *WindowOutput) Emit(value []byte) { Emit(o.key, value, o.ts) }

// EmitTo sends value to the side output called output.
func (o *WindowOutput) EmitTo(output string, value []byte) { EmitTo(output, o.key, value, o.ts) }

// contents keeps the elements of windows in their namespaces.
type contents interface {
	add(ns, value []byte) error                                        // value is a record's encoded value
	merge(target []byte, sources [][]byte)                             // moves the sources' contents into target
	fire(key []byte, w TimeWindow, ns []byte, out *WindowOutput) error // emits the result, if any
	clear(ns []byte)
}

const (
	contentsState = "streamd.window.contents"
	sessionsState = "streamd.window.sessions"
)

// WindowFunction computes the result of a window from its records of type
// T: ReduceWindow, AggregateWindow, ProcessWindow or AggregateProcessWindow.
type WindowFunction[T any] struct {
	make func(in Codec[T]) contents
}

// ReduceWindow folds a window's values with reduce, incrementally; the
// result is encoded with the window's input codec.
func ReduceWindow[T any](reduce func(a, b T) T) WindowFunction[T] {
	return WindowFunction[T]{make: func(in Codec[T]) contents {
		return &reduceContents[T]{state: NewValueState(contentsState, in), codec: in, reduce: reduce}
	}}
}

type reduceContents[T any] struct {
	state  ValueStateOf[T]
	codec  Codec[T]
	reduce func(a, b T) T
	buf    []byte
}

func (c *reduceContents[T]) add(ns, value []byte) error {
	s := c.state.In(ns)
	old, ok := s.Get()
	if !ok {
		hostMStatePut(contentsState, currentKey("window"), ns, nil, value)
		return nil
	}
	v, err := c.codec.Decode(value) // a copy: reduce may keep it
	if err != nil {
		return err
	}
	s.Set(c.reduce(old, v))
	return nil
}

func (c *reduceContents[T]) merge(target []byte, sources [][]byte) {
	acc, ok := c.state.In(target).Get()
	for _, src := range sources {
		s := c.state.In(src)
		if v, has := s.Get(); has {
			if ok {
				acc = c.reduce(acc, v)
			} else {
				acc, ok = v, true
			}
			s.Clear()
		}
	}
	if ok {
		c.state.In(target).Set(acc)
	}
}

func (c *reduceContents[T]) fire(_ []byte, _ TimeWindow, ns []byte, out *WindowOutput) error {
	v, ok := c.state.In(ns).Get()
	if ok {
		c.buf = c.codec.Encode(c.buf[:0], v)
		out.Emit(c.buf)
	}
	return nil
}

func (c *reduceContents[T]) clear(ns []byte) { c.state.In(ns).Clear() }

// aggContents keeps an accumulator per window; result turns it into output.
type aggContents[IN, ACC, OUT any] struct {
	state  ValueStateOf[ACC]
	in     Codec[IN]
	agg    Aggregator[IN, ACC, OUT]
	result func(key []byte, w TimeWindow, r OUT, out *WindowOutput) error
}

func (c *aggContents[IN, ACC, OUT]) add(ns, value []byte) error {
	v, err := c.in.Decode(value) // a copy: the aggregator may keep it
	if err != nil {
		return err
	}
	s := c.state.In(ns)
	acc, ok := s.Get()
	if !ok {
		acc = c.agg.CreateAccumulator()
	}
	s.Set(c.agg.Add(v, acc))
	return nil
}

func (c *aggContents[IN, ACC, OUT]) merge(target []byte, sources [][]byte) {
	acc, ok := c.state.In(target).Get()
	for _, src := range sources {
		s := c.state.In(src)
		if a, has := s.Get(); has {
			if ok {
				acc = c.agg.Merge(acc, a)
			} else {
				acc, ok = a, true
			}
			s.Clear()
		}
	}
	if ok {
		c.state.In(target).Set(acc)
	}
}

func (c *aggContents[IN, ACC, OUT]) fire(key []byte, w TimeWindow, ns []byte, out *WindowOutput) error {
	acc, ok := c.state.In(ns).Get()
	if !ok {
		return nil
	}
	return c.result(key, w, c.agg.GetResult(acc), out)
}

func (c *aggContents[IN, ACC, OUT]) clear(ns []byte) { c.state.In(ns).Clear() }

// AggregateWindow aggregates a window's values incrementally with agg
// (its accumulator encoded with accCodec); the result is encoded with
// outCodec.
func AggregateWindow[IN, ACC, OUT any](accCodec Codec[ACC], outCodec Codec[OUT], agg Aggregator[IN, ACC, OUT]) WindowFunction[IN] {
	var buf []byte
	return AggregateProcessWindow(accCodec, agg, func(_ []byte, _ TimeWindow, r OUT, out *WindowOutput) error {
		buf = outCodec.Encode(buf[:0], r)
		out.Emit(buf)
		return nil
	})
}

// AggregateProcessWindow aggregates a window's values incrementally with
// agg, then hands the result to f with the key and the window, which emits
// what it makes of them (Flink's aggregate(aggregateFunction, windowFunction)).
func AggregateProcessWindow[IN, ACC, OUT any](accCodec Codec[ACC], agg Aggregator[IN, ACC, OUT],
	f func(key []byte, w TimeWindow, result OUT, out *WindowOutput) error) WindowFunction[IN] {
	return WindowFunction[IN]{make: func(in Codec[IN]) contents {
		return &aggContents[IN, ACC, OUT]{state: NewValueState(contentsState, accCodec), in: in, agg: agg, result: f}
	}}
}

// ProcessWindow keeps all values of a window (list state) and hands them to
// f when the window fires, in the order they arrived.
func ProcessWindow[T any](f func(key []byte, w TimeWindow, elems []T, out *WindowOutput) error) WindowFunction[T] {
	return WindowFunction[T]{make: func(in Codec[T]) contents {
		return &listContents[T]{state: NewListState(contentsState, in), f: f}
	}}
}

type listContents[T any] struct {
	state ListStateOf[T]
	f     func(key []byte, w TimeWindow, elems []T, out *WindowOutput) error
}

func (c *listContents[T]) add(ns, value []byte) error {
	c.state.In(ns).addEncoded(value)
	return nil
}

func (c *listContents[T]) merge(target []byte, sources [][]byte) {
	t := c.state.In(target)
	for _, src := range sources {
		s := c.state.In(src)
		b, ok := s.d.get(nil)
		if !ok {
			continue
		}
		b = append([]byte(nil), b...) // scratch is reused by the appends
		if err := walkList(b, func(e []byte) bool { t.addEncoded(e); return true }); err != "" {
			s.d.fail(err)
		}
		s.Clear()
	}
}

func (c *listContents[T]) fire(key []byte, w TimeWindow, ns []byte, out *WindowOutput) error {
	elems := c.state.In(ns).Get()
	if len(elems) == 0 {
		return nil
	}
	return c.f(key, w, elems, out)
}

func (c *listContents[T]) clear(ns []byte) { c.state.In(ns).Clear() }

// --- the operator -------------------------------------------------------------

// WindowOption configures a window operator.
type WindowOption func(*windowConfig)

type windowConfig struct {
	lateness int64
	late     string
	emitLate func(output string, key, value []byte, ts int64) // EmitTo, set by LateOutput
	err      string
}

// AllowedLateness keeps a window's state until the watermark passes
// MaxTimestamp+d: a record that arrives after the window fired but within d
// is added and fires the window again with the updated result. Records
// later than that go to the LateOutput, or are dropped and counted. Event
// time only (processing-time windows are never late).
func AllowedLateness(d time.Duration) WindowOption {
	return func(c *windowConfig) {
		if d < 0 || d%time.Millisecond != 0 {
			c.err = "AllowedLateness " + d.String() + " is not a non-negative whole number of milliseconds"
		}
		c.lateness = d.Milliseconds()
	}
}

// LateOutput sends records too late for any window, unchanged, to the side
// output called name (the job file reads it as OP.name), instead of
// dropping them.
func LateOutput(name string) WindowOption {
	return func(c *windowConfig) {
		if why := checkOutputName(name); why != "" {
			c.err = "LateOutput: side output name " + strconv.Quote(name) + " " + why
		}
		c.late, c.emitLate = name, EmitTo
	}
}

// WindowOperator is the operator Window returns.
type WindowOperator[T any] struct {
	Base
	assigner WindowAssigner
	cfg      windowConfig
	contents contents
	sessions MapStateOf[[]byte, []byte]
	dropped  int64

	wins []TimeWindow
	ns   []byte
	out  WindowOutput
}

// Window returns an operator that assigns every record (its value decoded
// with in) to windows of its key and emits, for each window that fires, the
// result of fn as records with the key, timestamp MaxTimestamp and the
// encoded result as value. Event-time windows fire when the watermark passes
// MaxTimestamp, processing-time windows when the processing time does.
func Window[T any](assigner WindowAssigner, in Codec[T], fn WindowFunction[T], opts ...WindowOption) *WindowOperator[T] {
	w := &WindowOperator[T]{assigner: assigner}
	for _, o := range opts {
		o(&w.cfg)
	}
	if assigner.processingTime {
		w.cfg.lateness = 0
	}
	if fn.make == nil {
		w.cfg.err = "no window function (use ReduceWindow, AggregateWindow, ProcessWindow or AggregateProcessWindow)"
	} else {
		w.contents = fn.make(in)
	}
	if assigner.kind == session {
		w.sessions = NewMapState(sessionsState, Bytes, Bytes)
	}
	return w
}

// LateDropped returns the number of records this instance dropped because
// they were too late for every window (without a LateOutput).
func (w *WindowOperator[T]) LateDropped() int64 { return w.dropped }

func (w *WindowOperator[T]) Open(*Context) error {
	if w.assigner.err != "" {
		return errors.New("window: " + w.assigner.err)
	}
	if w.assigner.size == 0 && w.assigner.gap == 0 {
		return errors.New("window: no window assigner (use TumblingEventTimeWindows, ... )")
	}
	if w.cfg.err != "" {
		return errors.New("window: " + w.cfg.err)
	}
	return nil
}

func (w *WindowOperator[T]) cleanupTime(win TimeWindow) int64 {
	m := win.MaxTimestamp()
	if m > math.MaxInt64-w.cfg.lateness {
		return math.MaxInt64
	}
	return m + w.cfg.lateness
}

func (w *WindowOperator[T]) register(ts int64)    { w.assigner.register(ts) }
func (w *WindowOperator[T]) deleteTimer(ts int64) { w.assigner.drop(ts) }

func (w *WindowOperator[T]) ProcessElement(r Record, _ int) error {
	var ts, wm int64
	if w.assigner.processingTime {
		ts, wm = w.assigner.now(), MinWatermark
	} else {
		if r.Timestamp == NoTimestamp {
			return errors.New("window: a record of key " + strconv.Quote(string(r.Key)) +
				" has no event time: give the source a timestamp, or use a processing-time window assigner")
		}
		ts, wm = r.Timestamp, w.assigner.now()
	}
	var err error
	if w.wins, err = w.assigner.assign(w.wins[:0], ts); err != nil {
		return err
	}
	taken := false
	for _, win := range w.wins {
		if w.assigner.kind == session {
			// Merge first: a late window may join a session that is not.
			ok, err := w.addToSession(r, win, wm)
			if err != nil {
				return err
			}
			taken = taken || ok
			continue
		}
		if !w.assigner.processingTime && w.cleanupTime(win) <= wm {
			continue // late: its state is gone
		}
		taken = true
		if err := w.addTo(r, win, appendWindow(w.ns[:0], win), wm); err != nil {
			return err
		}
	}
	if !taken && !w.assigner.processingTime && (ts > math.MaxInt64-w.cfg.lateness || ts+w.cfg.lateness <= wm) {
		w.late(r)
	}
	return nil
}

// addTo adds r to window win, whose contents live in namespace ns, and
// fires it at once when the watermark has passed it (allowed lateness).
func (w *WindowOperator[T]) addTo(r Record, win TimeWindow, ns []byte, wm int64) error {
	w.ns = ns
	if err := w.contents.add(ns, r.Value); err != nil {
		return Reject(errors.New("window: cannot decode a record's value: " + err.Error()))
	}
	if !w.assigner.processingTime && win.MaxTimestamp() <= wm {
		if err := w.fire(r.Key, win, ns); err != nil {
			return err
		}
	} else {
		w.register(win.MaxTimestamp())
	}
	if c := w.cleanupTime(win); c != win.MaxTimestamp() && c != math.MaxInt64 {
		w.register(c)
	}
	return nil
}

func (w *WindowOperator[T]) fire(key []byte, win TimeWindow, ns []byte) error {
	w.out = WindowOutput{key: key, ts: win.MaxTimestamp()}
	return w.contents.fire(key, win, ns, &w.out)
}

func (w *WindowOperator[T]) late(r Record) {
	if w.cfg.late != "" {
		w.cfg.emitLate(w.cfg.late, r.Key, r.Value, r.Timestamp)
		return
	}
	if w.dropped == 0 {
		Log(LevelWarn, "window: dropping records too late for their windows (no LateOutput); LateDropped counts them")
	}
	w.dropped++
}

// sessionEntry is a session window of a key and the namespace its contents
// live in (the namespace of the first window of the session: merging
// windows moves the contents of the others there, not the session's).
type sessionEntry struct {
	win TimeWindow
	ns  []byte
}

func (w *WindowOperator[T]) sessionList() []sessionEntry {
	var all []sessionEntry
	for k, v := range w.sessions.All() {
		win, ok := parseWindow(k)
		if !ok || len(v) != 16 {
			w.sessions.d.fail("malformed session window entry")
		}
		all = append(all, sessionEntry{win, v})
	}
	return all
}

// addToSession merges the new window of r with the key's sessions it
// overlaps and adds r to the result (Flink's MergingWindowSet), unless the
// result is late: then it reports false and changes nothing.
func (w *WindowOperator[T]) addToSession(r Record, win TimeWindow, wm int64) (bool, error) {
	all := w.sessionList()
	merged := win
	var members []sessionEntry
	var others []sessionEntry
	// Sessions are disjoint and sorted by start: grow merged while it
	// touches the next ones.
	for changed := true; changed; {
		changed = false
		members, others = members[:0], others[:0]
		for _, s := range all {
			if merged.intersects(s.win) {
				members = append(members, s)
				if c := merged.cover(s.win); c != merged {
					merged, changed = c, true
				}
			} else {
				others = append(others, s)
			}
		}
	}
	if !w.assigner.processingTime && w.cleanupTime(merged) <= wm {
		return false, nil // the sessions it touches are gone too
	}
	if len(members) == 0 {
		ns := appendWindow(nil, win)
		w.sessions.Put(ns, ns)
		return true, w.addTo(r, win, ns, wm)
	}
	target := members[0].ns
	if len(members) > 1 || members[0].win != merged {
		keep := map[int64]bool{merged.MaxTimestamp(): true, w.cleanupTime(merged): true}
		for _, s := range others {
			keep[s.win.MaxTimestamp()], keep[w.cleanupTime(s.win)] = true, true
		}
		var sources [][]byte
		for i, s := range members {
			w.sessions.Remove(appendWindow(nil, s.win))
			for _, t := range []int64{s.win.MaxTimestamp(), w.cleanupTime(s.win)} {
				if !keep[t] {
					w.deleteTimer(t)
				}
			}
			if i > 0 {
				sources = append(sources, s.ns)
			}
		}
		w.sessions.Put(appendWindow(nil, merged), target)
		w.contents.merge(target, sources)
	}
	return true, w.addTo(r, merged, target, wm)
}

func (w *WindowOperator[T]) OnTimer(ts int64, key []byte) error {
	return w.onTime(ts, key, false)
}

func (w *WindowOperator[T]) OnProcessingTime(ts int64, key []byte) error {
	return w.onTime(ts, key, true)
}

// onTime fires the windows of key whose MaxTimestamp is ts and removes the
// state of those whose cleanup time is ts.
func (w *WindowOperator[T]) onTime(ts int64, key []byte, processingTime bool) error {
	if processingTime != w.assigner.processingTime {
		return nil
	}
	if w.assigner.kind == session {
		for _, s := range w.sessionList() {
			if s.win.MaxTimestamp() == ts {
				if err := w.fire(key, s.win, s.ns); err != nil {
					return err
				}
			}
			if w.cleanupTime(s.win) == ts {
				w.contents.clear(s.ns)
				w.sessions.Remove(appendWindow(nil, s.win))
			}
		}
		return nil
	}
	if ts == math.MaxInt64 {
		return nil
	}
	win := TimeWindow{ts + 1 - w.assigner.size, ts + 1}
	w.ns = appendWindow(w.ns[:0], win)
	if err := w.fire(key, win, w.ns); err != nil {
		return err
	}
	if w.cfg.lateness == 0 {
		w.contents.clear(w.ns)
	} else if ts >= math.MinInt64+w.cfg.lateness {
		end := ts - w.cfg.lateness + 1
		w.ns = appendWindow(w.ns[:0], TimeWindow{end - w.assigner.size, end})
		w.contents.clear(w.ns)
	}
	return nil
}
