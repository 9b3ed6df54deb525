package streamd

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"unsafe"
)

// Codec encodes values of type T to bytes and back: the typed state
// descriptors, the typed helpers (MapOf, ...) and the windows use one for
// every value they store or read.
//
// Encode appends the encoding of v to dst and returns the extended slice.
// Decode returns the value encoded in b; b is valid only during the call, so
// a Decode that keeps bytes copies them.
type Codec[T any] interface {
	Encode(dst []byte, v T) []byte
	Decode(b []byte) (T, error)
}

// The built-in codecs. Int64 and Float64 are 8 bytes little-endian (the
// encoding of Value.PutInt64; for Float64 the IEEE 754 bits); String is the
// bytes of the string; Bytes is the bytes as they are. Their Decode copies.
// The typed helpers (MapOf, FilterOf, FlatMapOf, ProcessOf) decode record
// values with String and Bytes without copying: there the string or slice
// points into the record, valid only during the call, like Record.Value
// (strings.Clone or bytes.Clone what you keep).
var (
	Bytes   Codec[[]byte]  = bytesCodec{}
	String  Codec[string]  = stringCodec{}
	Int64   Codec[int64]   = int64Codec{}
	Float64 Codec[float64] = float64Codec{}
)

// JSON returns a codec of T as JSON (encoding/json). Its Decode starts from
// the zero T every time.
func JSON[T any]() Codec[T] { return jsonCodec[T]{} }

// intoDecoder is implemented by codecs that can decode into a reused value.
type intoDecoder[T any] interface {
	decodeInto(b []byte, v *T) error
}

// codecKind names the built-in codecs, which the typed helpers encode and
// decode inline: in Go's wasm code every call costs, and an interface call
// per value would make them much slower than the raw byte API.
type codecKind uint8

const (
	kindOther codecKind = iota
	kindBytes
	kindString
	kindInt64
	kindFloat64
)

func kindOf[T any](c Codec[T]) codecKind {
	switch any(c).(type) {
	case bytesCodec:
		return kindBytes
	case stringCodec:
		return kindString
	case int64Codec:
		return kindInt64
	case float64Codec:
		return kindFloat64
	}
	return kindOther
}

// valueDecoder decodes record values, which live only for the call: the
// built-in codecs inline (String and Bytes without copying), others into a
// reused value if they can, else with Decode.
type valueDecoder[T any] struct {
	kind  codecKind
	codec Codec[T]
	into  intoDecoder[T]
}

func newDecoder[T any](c Codec[T]) valueDecoder[T] {
	d := valueDecoder[T]{kind: kindOf(c), codec: c}
	d.into, _ = c.(intoDecoder[T])
	return d
}

// decode decodes b into *v. For a built-in kind T is that kind's type (the
// codec's methods fix it), so the unsafe conversions are exact.
func (d *valueDecoder[T]) decode(b []byte, v *T) (err error) {
	p := unsafe.Pointer(v)
	switch d.kind {
	case kindInt64:
		if len(b) != 8 {
			return errors.New("Int64: " + strconv.Itoa(len(b)) + " bytes, not 8")
		}
		*(*int64)(p) = int64(binary.LittleEndian.Uint64(b))
	case kindBytes:
		*(*[]byte)(p) = b
	case kindString:
		*(*string)(p) = unsafe.String(unsafe.SliceData(b), len(b))
	case kindFloat64:
		if len(b) != 8 {
			return errors.New("Float64: " + strconv.Itoa(len(b)) + " bytes, not 8")
		}
		*(*float64)(p) = math.Float64frombits(binary.LittleEndian.Uint64(b))
	default:
		if d.into != nil {
			return d.into.decodeInto(b, v)
		}
		*v, err = d.codec.Decode(b)
	}
	return err
}

// appendValue appends the encoding of v with c of kind k.
func appendValue[T any](dst []byte, k codecKind, c Codec[T], v *T) []byte {
	p := unsafe.Pointer(v)
	switch k {
	case kindInt64:
		return binary.LittleEndian.AppendUint64(dst, uint64(*(*int64)(p)))
	case kindBytes:
		return append(dst, *(*[]byte)(p)...)
	case kindString:
		return append(dst, *(*string)(p)...)
	case kindFloat64:
		return binary.LittleEndian.AppendUint64(dst, math.Float64bits(*(*float64)(p)))
	}
	return c.Encode(dst, *v)
}

type bytesCodec struct{}

func (bytesCodec) Encode(dst []byte, v []byte) []byte { return append(dst, v...) }
func (bytesCodec) Decode(b []byte) ([]byte, error)    { return append(make([]byte, 0, len(b)), b...), nil }

type stringCodec struct{}

func (stringCodec) Encode(dst []byte, v string) []byte { return append(dst, v...) }
func (stringCodec) Decode(b []byte) (string, error)    { return string(b), nil }

type int64Codec struct{}

func (int64Codec) Encode(dst []byte, v int64) []byte {
	return binary.LittleEndian.AppendUint64(dst, uint64(v))
}
func (int64Codec) Decode(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, errors.New("Int64: " + strconv.Itoa(len(b)) + " bytes, not 8")
	}
	return int64(binary.LittleEndian.Uint64(b)), nil
}

type float64Codec struct{}

func (float64Codec) Encode(dst []byte, v float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(v))
}
func (float64Codec) Decode(b []byte) (float64, error) {
	if len(b) != 8 {
		return 0, errors.New("Float64: " + strconv.Itoa(len(b)) + " bytes, not 8")
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
}

type jsonCodec[T any] struct{}

func (jsonCodec[T]) Encode(dst []byte, v T) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		Fail("streamd: JSON codec: " + err.Error())
	}
	return append(dst, b...)
}

func (jsonCodec[T]) Decode(b []byte) (T, error) {
	var v T
	err := json.Unmarshal(b, &v)
	return v, err
}

func (jsonCodec[T]) decodeInto(b []byte, v *T) error {
	var zero T
	*v = zero
	return json.Unmarshal(b, v)
}

// --- typed operators -------------------------------------------------------

// Output emits values of type T, encoded with its codec straight into the
// output frame (no buffer in between, no allocation with the built-in
// codecs). ProcessOf hands one to its function.
type Output[T any] struct {
	codec Codec[T]
	kind  codecKind
}

// NewOutput returns an Output that encodes with codec, for operators that
// emit typed values themselves.
func NewOutput[T any](codec Codec[T]) *Output[T] {
	return &Output[T]{codec: codec, kind: kindOf(codec)}
}

// Emit sends v downstream with key and event time ts (see Emit). The
// codec's Encode appends to the output frame and must not emit itself.
func (o *Output[T]) Emit(key []byte, v T, ts int64) {
	if !emitOK {
		emitOutside("Output.Emit")
	}
	at := out.begin(key, ts)
	out.end(at, appendValue(out.buf, o.kind, o.codec, &v))
	if out.size() >= flushThreshold {
		flush()
	}
}

// EmitWithHeaders is Emit of a record with headers h (an input record's,
// to keep them).
func (o *Output[T]) EmitWithHeaders(key []byte, v T, ts int64, h Headers) {
	if !emitOK {
		emitOutside("Output.EmitWithHeaders")
	}
	at := out.begin(key, ts)
	out.endWithHeaders(at, appendValue(out.buf, o.kind, o.codec, &v), len(key), h)
	if out.size() >= flushThreshold {
		flush()
	}
}

// emitFor emits v for the input record r: with its key, event time and
// headers (the typed helpers keep them, as Map does).
func (o *Output[T]) emitFor(r *Record, v T) {
	if len(r.Headers) == 0 {
		o.Emit(r.Key, v, r.Timestamp)
		return
	}
	o.EmitWithHeaders(r.Key, v, r.Timestamp, r.Headers)
}

// EmitTo sends v to the side output called output (see EmitTo).
func (o *Output[T]) EmitTo(output string, key []byte, v T, ts int64) {
	s := sideFor("Output.EmitTo", output)
	at := s.frame.begin(key, ts)
	s.frame.end(at, appendValue(s.frame.buf, o.kind, o.codec, &v))
	s.flushIfFull()
}

// undecodable is the error a typed operator returns for a record value its
// codec cannot decode: it rejects the record (the job file's on_error says
// what happens to it; by default the job fails with this text).
func undecodable(helper string, err error) error {
	return Reject(errors.New("streamd: " + helper + ": cannot decode the record's value: " + err.Error()))
}

// MapOf returns an operator that decodes every record's value with in,
// calls f and emits the result encoded with out, with the record's key and
// timestamp. A value in cannot decode rejects the record (see Reject). The
// value is decoded into a reused variable; with String or Bytes it points
// into the record and is valid only during the call (see String).
func MapOf[In, Out any](in Codec[In], out Codec[Out], f func(In) (Out, error)) Operator {
	if op := mapBuiltin(kindOf(in), kindOf(out), f); op != nil {
		return op
	}
	return &mapOfOp[In, Out]{dec: newDecoder(in), out: *NewOutput(out), f: f}
}

type mapOfOp[In, Out any] struct {
	Base
	dec valueDecoder[In]
	v   In
	out Output[Out]
	f   func(In) (Out, error)
}

func (m *mapOfOp[In, Out]) ProcessElement(r Record, _ int) error {
	if err := m.dec.decode(r.Value, &m.v); err != nil {
		return undecodable("MapOf", err)
	}
	o, err := m.f(m.v)
	if err != nil {
		return err
	}
	m.out.emitFor(&r, o)
	return nil
}

// mapBuiltin returns a plain (not generic) operator for a map from a
// built-in codec to the same one, or nil. In Go's wasm code a generic
// method pays for its dictionary and extra calls on every record; these keep
// MapOf as fast as the raw byte API.
func mapBuiltin(in, out codecKind, f any) Operator {
	if in != out {
		return nil
	}
	switch g := f.(type) {
	case func(int64) (int64, error):
		if in == kindInt64 {
			return &mapWord{name: "Int64", direct: g}
		}
	case func(float64) (float64, error):
		if in == kindFloat64 {
			return &mapWord{name: "Float64", f: func(w uint64) (uint64, error) {
				v, err := g(math.Float64frombits(w))
				return math.Float64bits(v), err
			}}
		}
	case func(string) (string, error):
		if in == kindString {
			return &mapString{f: g}
		}
	case func([]byte) ([]byte, error):
		if in == kindBytes {
			return &mapBytes{f: g}
		}
	}
	return nil
}

// mapWord maps 8-byte values (Int64, Float64).
type mapWord struct {
	Base
	name   string
	direct func(int64) (int64, error)   // Int64: f itself, one call less
	f      func(uint64) (uint64, error) // Float64: f on the bits
	buf    []byte
}

func (m *mapWord) ProcessElement(r Record, _ int) error {
	if len(r.Value) != 8 {
		return undecodable("MapOf", errors.New(m.name+": "+strconv.Itoa(len(r.Value))+" bytes, not 8"))
	}
	w := binary.LittleEndian.Uint64(r.Value)
	var err error
	if m.direct != nil {
		var v int64
		v, err = m.direct(int64(w))
		w = uint64(v)
	} else {
		w, err = m.f(w)
	}
	if err != nil {
		return err
	}
	m.buf = binary.LittleEndian.AppendUint64(m.buf[:0], w)
	EmitRecord(Record{Key: r.Key, Value: m.buf, Timestamp: r.Timestamp, Headers: r.Headers})
	return nil
}

type mapString struct {
	Base
	f func(string) (string, error)
}

func (m *mapString) ProcessElement(r Record, _ int) error {
	v, err := m.f(unsafe.String(unsafe.SliceData(r.Value), len(r.Value)))
	if err != nil {
		return err
	}
	EmitRecord(Record{Key: r.Key, Value: unsafe.Slice(unsafe.StringData(v), len(v)), Timestamp: r.Timestamp, Headers: r.Headers}) // copied
	return nil
}

type mapBytes struct {
	Base
	f func([]byte) ([]byte, error)
}

func (m *mapBytes) ProcessElement(r Record, _ int) error {
	v, err := m.f(r.Value)
	if err != nil {
		return err
	}
	EmitRecord(Record{Key: r.Key, Value: v, Timestamp: r.Timestamp, Headers: r.Headers})
	return nil
}

// FilterOf returns an operator that decodes every record's value with c and
// emits the record unchanged when keep returns true.
func FilterOf[T any](c Codec[T], keep func(T) (bool, error)) Operator {
	f := &filterBuiltin{kind: kindOf(c)}
	switch g := any(keep).(type) {
	case func(int64) (bool, error):
		f.i = g
	case func(float64) (bool, error):
		f.f = g
	case func(string) (bool, error):
		f.s = g
	case func([]byte) (bool, error):
		f.b = g
	}
	if f.kind != kindOther && (f.i != nil || f.f != nil || f.s != nil || f.b != nil) {
		return f
	}
	return &filterOfOp[T]{dec: newDecoder(c), keep: keep}
}

// filterBuiltin is FilterOf over a built-in codec as a plain operator (see
// mapBuiltin); kind says which of the functions is set.
type filterBuiltin struct {
	Base
	kind codecKind
	i    func(int64) (bool, error)
	f    func(float64) (bool, error)
	s    func(string) (bool, error)
	b    func([]byte) (bool, error)
}

func (o *filterBuiltin) ProcessElement(r Record, _ int) error {
	var keep bool
	var err error
	switch o.kind {
	case kindInt64, kindFloat64:
		if len(r.Value) != 8 {
			return undecodable("FilterOf", errors.New(strconv.Itoa(len(r.Value))+" bytes, not 8"))
		}
		w := binary.LittleEndian.Uint64(r.Value)
		if o.i != nil {
			keep, err = o.i(int64(w))
		} else {
			keep, err = o.f(math.Float64frombits(w))
		}
	case kindString:
		keep, err = o.s(unsafe.String(unsafe.SliceData(r.Value), len(r.Value)))
	default:
		keep, err = o.b(r.Value)
	}
	if err != nil {
		return err
	}
	if keep {
		EmitRecord(r)
	}
	return nil
}

type filterOfOp[T any] struct {
	Base
	dec  valueDecoder[T]
	v    T
	keep func(T) (bool, error)
}

func (f *filterOfOp[T]) ProcessElement(r Record, _ int) error {
	if err := f.dec.decode(r.Value, &f.v); err != nil {
		return undecodable("FilterOf", err)
	}
	ok, err := f.keep(f.v)
	if err != nil {
		return err
	}
	if ok {
		EmitRecord(r)
	}
	return nil
}

// FlatMapOf returns an operator that decodes every record's value with in
// and calls f, which emits any number of values through emit; each is
// encoded with out and sent with the record's key and timestamp.
func FlatMapOf[In, Out any](in Codec[In], out Codec[Out], f func(v In, emit func(Out)) error) Operator {
	m := &flatMapOfOp[In, Out]{dec: newDecoder(in), out: *NewOutput(out), f: f}
	m.emit = func(o Out) { m.out.emitFor(&m.rec, o) }
	return m
}

type flatMapOfOp[In, Out any] struct {
	Base
	dec  valueDecoder[In]
	v    In
	rec  Record
	out  Output[Out]
	emit func(Out)
	f    func(In, func(Out)) error
}

func (m *flatMapOfOp[In, Out]) ProcessElement(r Record, _ int) error {
	if err := m.dec.decode(r.Value, &m.v); err != nil {
		return undecodable("FlatMapOf", err)
	}
	m.rec = r
	err := m.f(m.v, m.emit)
	m.rec = Record{}
	return err
}

// ProcessOf returns an operator that decodes every record's value with in
// and calls f with the record, the decoded value and an Output encoding with
// out. f may use keyed state and timers of the record's key.
func ProcessOf[In, Out any](in Codec[In], out Codec[Out], f func(r Record, v In, out *Output[Out]) error) Operator {
	return &processOfOp[In, Out]{dec: newDecoder(in), out: *NewOutput(out), f: f}
}

type processOfOp[In, Out any] struct {
	Base
	dec valueDecoder[In]
	v   In
	out Output[Out]
	f   func(Record, In, *Output[Out]) error
}

func (p *processOfOp[In, Out]) ProcessElement(r Record, _ int) error {
	if err := p.dec.decode(r.Value, &p.v); err != nil {
		return undecodable("ProcessOf", err)
	}
	return p.f(r, p.v, &p.out)
}
