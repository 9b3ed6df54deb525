package streamd

import (
	"encoding/binary"
	"iter"
	"strconv"
	"time"
)

// Typed keyed state (SPEC14 section 4) on the structured-state imports
// (mstate_*): every call works on the current key (see CurrentKey), in the
// namespace the descriptor was given with In (none by default). A state name
// belongs to one kind of state. Misuse (no current key, a value the codec
// cannot decode) fails the subtask with a message that names the state.
//
// Descriptors are small values: create them once, at package level or in
// Open; In returns a copy for another namespace without allocating.

// TTLUpdate says which accesses restart an entry's time to live.
type TTLUpdate int32

const (
	// UpdateOnCreateAndWrite: an entry expires ttl after its last write.
	UpdateOnCreateAndWrite TTLUpdate = 0
	// UpdateOnReadAndWrite: reads restart the time to live too.
	UpdateOnReadAndWrite TTLUpdate = 1
)

// StateOption configures a state descriptor.
type StateOption func(*stateConfig)

type stateConfig struct {
	ttl    time.Duration
	update TTLUpdate
}

// WithTTL makes the entries of the state expire d after their last write (or
// access, with UpdateOnReadAndWrite), by the host's processing time. Expired
// entries are never returned; list elements expire one by one. The host
// learns the TTL in Open: create a descriptor with WithTTL at package level
// or in Open. d is rounded up to whole milliseconds; d <= 0 means no TTL.
func WithTTL(d time.Duration, update TTLUpdate) StateOption {
	sendTTL, applyTTLs = hostStateTTL, applyTTLSettings
	return func(c *stateConfig) { c.ttl, c.update = d, update }
}

type ttlSetting struct {
	name  string
	ms    int64
	flags int32
}

var (
	ttls []ttlSetting
	// WithTTL sets these, so that a module that never calls it does not
	// import state_ttl. Open calls applyTTLs first.
	sendTTL   func(name string, ms int64, flags int32)
	applyTTLs func()
)

func applyTTLSettings() {
	for _, t := range ttls {
		sendTTL(t.name, t.ms, t.flags)
	}
}

// desc is what every typed state shares: its name and namespace.
type desc struct {
	name string
	ns   []byte
}

func newDesc(name string, opts []StateOption) desc {
	var c stateConfig
	for _, o := range opts {
		o(&c)
	}
	if c.ttl > 0 {
		ms := int64((c.ttl + time.Millisecond - 1) / time.Millisecond)
		t := ttlSetting{name: name, ms: ms, flags: int32(c.update & 1)}
		switch cur {
		case phaseNone:
		case phaseOpen:
			sendTTL(t.name, t.ms, t.flags)
		default:
			Fail("streamd: state " + strconv.Quote(name) + ": a state WithTTL is created in " + cur.String() +
				": create it at package level or in Open, where the host learns its TTL")
		}
		replaced := false
		for i := range ttls {
			if ttls[i].name == name {
				ttls[i], replaced = t, true
			}
		}
		if !replaced {
			ttls = append(ttls, t)
		}
	}
	return desc{name: name}
}

func (d desc) key() []byte { return currentKey("state " + strconv.Quote(d.name)) }

func (d desc) fail(why string) {
	Fail("streamd: state " + strconv.Quote(d.name) + ": " + why)
}

// get returns the entry ukey in the scratch buffer (valid until the next
// state call).
func (d desc) get(ukey []byte) ([]byte, bool) {
	key := d.key()
	for {
		buf := scratch[:cap(scratch)]
		n := hostMStateGet(d.name, key, d.ns, ukey, buf)
		if n < 0 {
			return nil, false
		}
		if int(n) <= len(buf) {
			return buf[:n], true
		}
		scratch = make([]byte, n)
	}
}

// entries returns a copy of the entries frame of the current key and
// namespace, and false when there are none.
func (d desc) entries() ([]byte, bool) {
	key := d.key()
	for {
		buf := scratch[:cap(scratch)]
		n := hostMStateEntries(d.name, key, d.ns, buf)
		if n < 0 {
			return nil, false
		}
		if int(n) <= len(buf) {
			return append(make([]byte, 0, n), buf[:n]...), true
		}
		scratch = make([]byte, n)
	}
}

// encBuf is the reused buffer values and user keys are encoded into.
var encBuf, ukeyBuf []byte

// --- ValueState --------------------------------------------------------------

// ValueStateOf is keyed value state (Flink's ValueState) of type T.
type ValueStateOf[T any] struct {
	d     desc
	codec Codec[T]
}

// NewValueState returns the value state called name, encoded with codec.
func NewValueState[T any](name string, codec Codec[T], opts ...StateOption) ValueStateOf[T] {
	return ValueStateOf[T]{d: newDesc(name, opts), codec: codec}
}

// Name returns the state's name.
func (s ValueStateOf[T]) Name() string { return s.d.name }

// In returns the same state in namespace ns (which it keeps: do not change
// ns afterwards).
func (s ValueStateOf[T]) In(ns []byte) ValueStateOf[T] { s.d.ns = ns; return s }

// Get returns the value of the current key, and whether there is one.
func (s ValueStateOf[T]) Get() (T, bool) {
	b, ok := s.d.get(nil)
	if !ok {
		var zero T
		return zero, false
	}
	v, err := s.codec.Decode(b)
	if err != nil {
		s.d.fail("cannot decode the value: " + err.Error())
	}
	return v, true
}

// Set stores v for the current key.
func (s ValueStateOf[T]) Set(v T) {
	key := s.d.key()
	encBuf = s.codec.Encode(encBuf[:0], v)
	hostMStatePut(s.d.name, key, s.d.ns, nil, encBuf)
}

// Clear removes the value of the current key.
func (s ValueStateOf[T]) Clear() { hostMStateRemove(s.d.name, s.d.key(), s.d.ns, nil) }

// --- ListState ---------------------------------------------------------------

// ListStateOf is keyed list state (Flink's ListState) of type T: one list per
// key and namespace, appended to without reading it.
type ListStateOf[T any] struct {
	d     desc
	codec Codec[T]
}

// NewListState returns the keyed list state called name, elements encoded
// with codec.
func NewListState[T any](name string, codec Codec[T], opts ...StateOption) ListStateOf[T] {
	return ListStateOf[T]{d: newDesc(name, opts), codec: codec}
}

// Name returns the state's name.
func (s ListStateOf[T]) Name() string { return s.d.name }

// In returns the same state in namespace ns.
func (s ListStateOf[T]) In(ns []byte) ListStateOf[T] { s.d.ns = ns; return s }

// Add appends v to the list of the current key.
func (s ListStateOf[T]) Add(v T) {
	key := s.d.key()
	encBuf = s.codec.Encode(encBuf[:0], v)
	hostMStateAppend(s.d.name, key, s.d.ns, nil, encBuf)
}

// addEncoded appends an element already encoded with the codec.
func (s ListStateOf[T]) addEncoded(b []byte) {
	hostMStateAppend(s.d.name, s.d.key(), s.d.ns, nil, b)
}

// Get returns the elements of the current key's list in the order they were
// added (nil when there are none).
func (s ListStateOf[T]) Get() []T {
	b, ok := s.d.get(nil)
	if !ok {
		return nil
	}
	var all []T
	err := walkList(b, func(e []byte) bool {
		v, err := s.codec.Decode(e)
		if err != nil {
			s.d.fail("cannot decode a list element: " + err.Error())
		}
		all = append(all, v)
		return true
	})
	if err != "" {
		s.d.fail(err)
	}
	return all
}

// Update replaces the list of the current key by vs.
func (s ListStateOf[T]) Update(vs []T) {
	key := s.d.key()
	hostMStateRemove(s.d.name, key, s.d.ns, nil)
	for _, v := range vs {
		encBuf = s.codec.Encode(encBuf[:0], v)
		hostMStateAppend(s.d.name, key, s.d.ns, nil, encBuf)
	}
}

// Clear removes the list of the current key.
func (s ListStateOf[T]) Clear() { hostMStateRemove(s.d.name, s.d.key(), s.d.ns, nil) }

// walkList calls f on each element of a list frame (u32 count, then count
// times u32 length and bytes) until f returns false; it returns what is
// wrong with a malformed frame, or "".
func walkList(b []byte, f func(e []byte) bool) string {
	if len(b) < 4 {
		return "malformed list frame from the host: " + strconv.Itoa(len(b)) + " bytes"
	}
	n := binary.LittleEndian.Uint32(b)
	off := 4
	for i := uint32(0); i < n; i++ {
		if len(b)-off < 4 {
			return "malformed list frame from the host: truncated at byte " + strconv.Itoa(off)
		}
		l := int(binary.LittleEndian.Uint32(b[off:]))
		off += 4
		if l > len(b)-off {
			return "malformed list frame from the host: element runs past the frame at byte " + strconv.Itoa(off)
		}
		if !f(b[off : off+l : off+l]) {
			return ""
		}
		off += l
	}
	return ""
}

// --- MapState ----------------------------------------------------------------

// MapStateOf is keyed map state (Flink's MapState): per key and namespace, a
// map of user keys K to values V. All returns the entries sorted by the
// bytes of the encoded user keys.
type MapStateOf[K, V any] struct {
	d  desc
	kc Codec[K]
	vc Codec[V]
}

// NewMapState returns the map state called name, user keys encoded with kc
// and values with vc.
func NewMapState[K, V any](name string, kc Codec[K], vc Codec[V], opts ...StateOption) MapStateOf[K, V] {
	return MapStateOf[K, V]{d: newDesc(name, opts), kc: kc, vc: vc}
}

// Name returns the state's name.
func (s MapStateOf[K, V]) Name() string { return s.d.name }

// In returns the same state in namespace ns.
func (s MapStateOf[K, V]) In(ns []byte) MapStateOf[K, V] { s.d.ns = ns; return s }

func (s MapStateOf[K, V]) ukey(k K) []byte {
	ukeyBuf = s.kc.Encode(ukeyBuf[:0], k)
	return ukeyBuf
}

// Get returns the value of user key k, and whether there is one.
func (s MapStateOf[K, V]) Get(k K) (V, bool) {
	b, ok := s.d.get(s.ukey(k))
	if !ok {
		var zero V
		return zero, false
	}
	v, err := s.vc.Decode(b)
	if err != nil {
		s.d.fail("cannot decode a value: " + err.Error())
	}
	return v, true
}

// Put stores v under user key k.
func (s MapStateOf[K, V]) Put(k K, v V) {
	key := s.d.key()
	uk := s.ukey(k)
	encBuf = s.vc.Encode(encBuf[:0], v)
	hostMStatePut(s.d.name, key, s.d.ns, uk, encBuf)
}

// Remove removes user key k.
func (s MapStateOf[K, V]) Remove(k K) {
	key := s.d.key()
	hostMStateRemove(s.d.name, key, s.d.ns, s.ukey(k))
}

// Contains reports whether user key k has a value.
func (s MapStateOf[K, V]) Contains(k K) bool {
	key := s.d.key()
	return hostMStateGet(s.d.name, key, s.d.ns, s.ukey(k), nil) >= 0
}

// IsEmpty reports whether the map of the current key is empty.
func (s MapStateOf[K, V]) IsEmpty() bool {
	return hostMStateEntries(s.d.name, s.d.key(), s.d.ns, nil) < 0
}

// Clear removes every entry of the current key's map.
func (s MapStateOf[K, V]) Clear() { hostMStateClear(s.d.name, s.d.key(), s.d.ns) }

// All returns the entries of the current key's map, sorted by encoded user
// key. It reads them when called; the loop body may use state freely.
func (s MapStateOf[K, V]) All() iter.Seq2[K, V] {
	b, ok := s.d.entries()
	return func(yield func(K, V) bool) {
		if !ok {
			return
		}
		err := walkEntries(b, func(uk, v []byte) bool {
			k, err := s.kc.Decode(uk)
			if err != nil {
				s.d.fail("cannot decode a user key: " + err.Error())
			}
			val, err := s.vc.Decode(v)
			if err != nil {
				s.d.fail("cannot decode a value: " + err.Error())
			}
			return yield(k, val)
		})
		if err != "" {
			s.d.fail(err)
		}
	}
}

// walkEntries calls f on each (ukey, value) of an entries frame (u32 count,
// then count times u32 length, ukey, u32 length, value).
func walkEntries(b []byte, f func(ukey, val []byte) bool) string {
	if len(b) < 4 {
		return "malformed entries frame from the host: " + strconv.Itoa(len(b)) + " bytes"
	}
	n := binary.LittleEndian.Uint32(b)
	off := 4
	next := func() ([]byte, bool) {
		if len(b)-off < 4 {
			return nil, false
		}
		l := int(binary.LittleEndian.Uint32(b[off:]))
		off += 4
		if l > len(b)-off {
			return nil, false
		}
		off += l
		return b[off-l : off : off], true
	}
	for i := uint32(0); i < n; i++ {
		uk, ok1 := next()
		v, ok2 := next()
		if !ok1 || !ok2 {
			return "malformed entries frame from the host at byte " + strconv.Itoa(off)
		}
		if !f(uk, v) {
			return ""
		}
	}
	return ""
}

// --- ReducingState and AggregatingState --------------------------------------

// ReducingStateOf keeps one value per key that Add folds new values into
// with reduce (Flink's ReducingState).
type ReducingStateOf[T any] struct {
	v      ValueStateOf[T]
	reduce func(a, b T) T
}

// NewReducingState returns the reducing state called name.
func NewReducingState[T any](name string, codec Codec[T], reduce func(a, b T) T, opts ...StateOption) ReducingStateOf[T] {
	return ReducingStateOf[T]{v: NewValueState(name, codec, opts...), reduce: reduce}
}

// Name returns the state's name.
func (s ReducingStateOf[T]) Name() string { return s.v.d.name }

// In returns the same state in namespace ns.
func (s ReducingStateOf[T]) In(ns []byte) ReducingStateOf[T] { s.v = s.v.In(ns); return s }

// Add folds v into the current key's value: reduce(old, v), or v when there
// is none.
func (s ReducingStateOf[T]) Add(v T) {
	if old, ok := s.v.Get(); ok {
		v = s.reduce(old, v)
	}
	s.v.Set(v)
}

// Get returns the current key's value, and whether there is one.
func (s ReducingStateOf[T]) Get() (T, bool) { return s.v.Get() }

// Clear removes the current key's value.
func (s ReducingStateOf[T]) Clear() { s.v.Clear() }

// Aggregator is an incremental aggregation (Flink's AggregateFunction): IN
// values are added to an accumulator ACC, which gives the result OUT;
// Merge combines two accumulators (merging session windows need it).
type Aggregator[IN, ACC, OUT any] interface {
	CreateAccumulator() ACC
	Add(in IN, acc ACC) ACC
	GetResult(acc ACC) OUT
	Merge(a, b ACC) ACC
}

// AggregatingStateOf keeps one accumulator per key (Flink's
// AggregatingState).
type AggregatingStateOf[IN, ACC, OUT any] struct {
	acc ValueStateOf[ACC]
	agg Aggregator[IN, ACC, OUT]
}

// NewAggregatingState returns the aggregating state called name, its
// accumulator encoded with accCodec.
func NewAggregatingState[IN, ACC, OUT any](name string, accCodec Codec[ACC], agg Aggregator[IN, ACC, OUT], opts ...StateOption) AggregatingStateOf[IN, ACC, OUT] {
	return AggregatingStateOf[IN, ACC, OUT]{acc: NewValueState(name, accCodec, opts...), agg: agg}
}

// Name returns the state's name.
func (s AggregatingStateOf[IN, ACC, OUT]) Name() string { return s.acc.d.name }

// In returns the same state in namespace ns.
func (s AggregatingStateOf[IN, ACC, OUT]) In(ns []byte) AggregatingStateOf[IN, ACC, OUT] {
	s.acc = s.acc.In(ns)
	return s
}

// Add adds in to the current key's accumulator (created when there is none).
func (s AggregatingStateOf[IN, ACC, OUT]) Add(in IN) {
	acc, ok := s.acc.Get()
	if !ok {
		acc = s.agg.CreateAccumulator()
	}
	s.acc.Set(s.agg.Add(in, acc))
}

// Get returns the result of the current key's accumulator, and whether
// there is one.
func (s AggregatingStateOf[IN, ACC, OUT]) Get() (OUT, bool) {
	acc, ok := s.acc.Get()
	if !ok {
		var zero OUT
		return zero, false
	}
	return s.agg.GetResult(acc), true
}

// Clear removes the current key's accumulator.
func (s AggregatingStateOf[IN, ACC, OUT]) Clear() { s.acc.Clear() }

// --- RawState ----------------------------------------------------------------

// RawState is structured keyed state without codecs: the host's entries of
// the current key addressed by namespace and user key as bytes (ABI
// mstate_*). Get of a list entry returns the host's list frame, Entries the
// entries frame (abi/ABI.md). For other languages' layouts and for tests;
// the typed states are built on the same entries.
type RawState struct{ d desc }

// NewRawState returns the raw structured state called name.
func NewRawState(name string, opts ...StateOption) RawState { return RawState{d: newDesc(name, opts)} }

// Get returns a copy of entry (ns, ukey): a value, or the frame of a list.
func (s RawState) Get(ns, ukey []byte) ([]byte, bool) {
	s.d.ns = ns
	b, ok := s.d.get(ukey)
	if !ok {
		return nil, false
	}
	return append(make([]byte, 0, len(b)), b...), true
}

// Put makes (ns, ukey) a value entry holding val.
func (s RawState) Put(ns, ukey, val []byte) { hostMStatePut(s.d.name, s.d.key(), ns, ukey, val) }

// Append appends val to the list entry (ns, ukey), creating it.
func (s RawState) Append(ns, ukey, val []byte) { hostMStateAppend(s.d.name, s.d.key(), ns, ukey, val) }

// Remove removes entry (ns, ukey).
func (s RawState) Remove(ns, ukey []byte) { hostMStateRemove(s.d.name, s.d.key(), ns, ukey) }

// Entries returns a copy of the entries frame of namespace ns, and false when
// it has none.
func (s RawState) Entries(ns []byte) ([]byte, bool) {
	s.d.ns = ns
	return s.d.entries()
}

// Clear removes every entry of namespace ns.
func (s RawState) Clear(ns []byte) { hostMStateClear(s.d.name, s.d.key(), ns) }
