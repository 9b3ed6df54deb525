// Command interval-join joins two streams keyed by the same key on event
// time: input 0 (orders) and input 1 (shipments) pair up when
//
//	order.ts + lower <= shipment.ts <= order.ts + upper
//
// (config lower and upper, Go durations, default 0s and 10m; Flink's
// intervalJoin(...).between(lower, upper)). For every pair it emits the JSON
// line {"key":K,"order":<order>,"shipment":<shipment>} with the key and the
// later of the two timestamps.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o interval-join.wasm .
//
// Each side is buffered in map state per key (event time -> the records at
// that time). An event-time timer removes an order once the watermark has
// passed order.ts+upper and a shipment once it has passed shipment.ts-lower:
// no record that is not late can pair with them any more. Records behind the
// watermark are dropped (as Flink does). The buffers also have a TTL (config
// ttl, default 1h of processing time) so that state cannot grow without
// bound if the watermark stalls.
package main

import (
	"encoding/binary"
	"errors"
	"strconv"
	"time"

	streamd "github.com/streamd/streamd/sdk/go"
)

// timeKey encodes an event time as 8 bytes big-endian with the sign bit
// flipped, so that map state lists the buffered times in time order.
type timeKey struct{}

func (timeKey) Encode(dst []byte, ts int64) []byte {
	return binary.BigEndian.AppendUint64(dst, uint64(ts)^(1<<63))
}

func (timeKey) Decode(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, errors.New("time key of " + strconv.Itoa(len(b)) + " bytes")
	}
	return int64(binary.BigEndian.Uint64(b) ^ (1 << 63)), nil
}

// records encodes the records buffered at one time: each as u32 length and
// bytes.
type records struct{}

func (records) Encode(dst []byte, rs [][]byte) []byte {
	for _, r := range rs {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(r)))
		dst = append(dst, r...)
	}
	return dst
}

func (records) Decode(b []byte) ([][]byte, error) {
	var rs [][]byte
	for len(b) > 0 {
		if len(b) < 4 || int(binary.LittleEndian.Uint32(b)) > len(b)-4 {
			return nil, errors.New("truncated record list")
		}
		n := int(binary.LittleEndian.Uint32(b))
		rs = append(rs, append([]byte(nil), b[4:4+n]...))
		b = b[4+n:]
	}
	return rs, nil
}

type join struct {
	streamd.Base
	lower, upper int64 // ms
	sides        [2]streamd.MapStateOf[int64, [][]byte]
	dropped      int64
	out          []byte
}

func (j *join) Open(ctx *streamd.Context) error {
	var err error
	lower, err := duration(ctx.Config, "lower", 0)
	if err != nil {
		return err
	}
	upper, err := duration(ctx.Config, "upper", 10*time.Minute)
	if err != nil {
		return err
	}
	ttl, err := duration(ctx.Config, "ttl", time.Hour)
	if err != nil {
		return err
	}
	if lower > upper {
		return errors.New("interval-join: lower " + lower.String() + " is above upper " + upper.String())
	}
	if ctx.NumInputs != 2 {
		return errors.New("interval-join: needs two inputs (orders, shipments), has " + strconv.Itoa(ctx.NumInputs))
	}
	j.lower, j.upper = lower.Milliseconds(), upper.Milliseconds()
	ttlOpt := streamd.WithTTL(ttl, streamd.UpdateOnCreateAndWrite)
	j.sides[0] = streamd.NewMapState[int64, [][]byte]("orders", timeKey{}, records{}, ttlOpt)
	j.sides[1] = streamd.NewMapState[int64, [][]byte]("shipments", timeKey{}, records{}, ttlOpt)
	return nil
}

func duration(c streamd.Config, key string, def time.Duration) (time.Duration, error) {
	s, ok := c[key]
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("interval-join: config " + key + " is " + s + ", not a Go duration (0s, 10m)")
	}
	return d, nil
}

// window returns the times of the other side that r (of input side at ts)
// pairs with, and the time after which r can pair with nothing new.
func (j *join) window(side int, ts int64) (from, to, cleanup int64) {
	if side == 0 {
		return ts + j.lower, ts + j.upper, ts + j.upper + 1
	}
	return ts - j.upper, ts - j.lower, ts - j.lower + 1
}

func (j *join) ProcessElement(r streamd.Record, input int) error {
	if input > 1 {
		return errors.New("interval-join: record on input " + strconv.Itoa(input))
	}
	if !r.HasTimestamp() {
		return errors.New("interval-join: a record without event time on input " + strconv.Itoa(input))
	}
	if r.Timestamp < streamd.CurrentWatermark() {
		if j.dropped == 0 {
			streamd.Log(streamd.LevelWarn, "interval-join: dropping records behind the watermark")
		}
		j.dropped++
		return nil
	}
	from, to, cleanup := j.window(input, r.Timestamp)
	for ts, others := range j.sides[1-input].All() {
		if ts < from || ts > to {
			continue
		}
		for _, o := range others {
			if input == 0 {
				j.emit(r.Key, r.Value, o, max(r.Timestamp, ts))
			} else {
				j.emit(r.Key, o, r.Value, max(r.Timestamp, ts))
			}
		}
	}
	mine := j.sides[input]
	buf, _ := mine.Get(r.Timestamp)
	mine.Put(r.Timestamp, append(buf, r.Value))
	streamd.RegisterEventTimeTimer(cleanup)
	return nil
}

func (j *join) emit(key, order, shipment []byte, ts int64) {
	b := append(j.out[:0], `{"key":`...)
	b = strconv.AppendQuote(b, string(key))
	b = append(b, `,"order":`...)
	b = append(b, order...)
	b = append(b, `,"shipment":`...)
	b = append(b, shipment...)
	j.out = append(b, '}')
	streamd.Emit(key, j.out, ts)
}

// OnTimer removes the buffered records of the timer's key that can pair
// with nothing new once the watermark is at ts.
func (j *join) OnTimer(ts int64, _ []byte) error {
	for side := range j.sides {
		for t := range j.sides[side].All() {
			if _, _, cleanup := j.window(side, t); cleanup <= ts {
				j.sides[side].Remove(t)
			}
		}
	}
	return nil
}

func newOperator() streamd.Operator { return &join{} }

func init() { streamd.Register(newOperator()) }

func main() {}
