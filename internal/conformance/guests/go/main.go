// Command conformance is the Go SDK's build of the conformance operator
// described in plan/conformance.md: the same behaviour is built with the Rust
// SDK and in hand-written WAT, and one test suite runs all three.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o conformance.wasm .
package main

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"unsafe"

	streamd "github.com/streamd/streamd/sdk/go"
)

var (
	count   = streamd.ValueState("count")
	totalLS = streamd.ListState("total", streamd.Split)
	ckptLS  = streamd.ListState("ckpt", streamd.Union)

	// hoard keeps every slice the "grow" record allocates reachable.
	hoard [][]byte
	// spins is written on every turn of the "spin" loop, so the loop has a
	// side effect the compiler must keep.
	spins atomic.Uint64
	// oobAddr is a variable so the compiler cannot see the address.
	oobAddr uintptr = 0xFFFFFFF0
)

type conformance struct {
	streamd.Base
	total uint64
	out   []byte
}

func u64le(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func (c *conformance) Open(ctx *streamd.Context) error {
	for _, e := range totalLS.Entries() {
		if len(e) != 8 {
			return errors.New("conformance: list state entry of total is not 8 bytes")
		}
		c.total += binary.LittleEndian.Uint64(e)
	}
	if ctx.Config["fail_in"] == "open" {
		streamd.Fail("conformance: fail in open")
	}
	streamd.Log(streamd.LevelInfo, "open")
	return nil
}

func (c *conformance) ProcessElement(r streamd.Record, input int) error {
	switch string(r.Value) {
	case "panic":
		panic("conformance panic")
	case "reject":
		return streamd.Reject(errors.New("conformance reject"))
	case "oob":
		p := (*byte)(unsafe.Add(unsafe.Pointer(nil), oobAddr))
		c.out = append(c.out[:0], *p)
	case "spin":
		for {
			spins.Add(1)
		}
	case "grow":
		for {
			b := make([]byte, 1<<20)
			b[0] = 1
			hoard = append(hoard, b)
		}
	case "del":
		count.Delete(r.Key)
		streamd.Emit(r.Key, []byte("del"), r.Timestamp)
		return nil
	case "timer":
		streamd.RegisterEventTimeTimer(r.Timestamp + 10)
	}
	n, _ := count.GetUint64(r.Key)
	n++
	count.PutUint64(r.Key, n)
	c.total++
	v := append(c.out[:0], r.Value...)
	v = append(v, byte(input))
	v = binary.LittleEndian.AppendUint64(v, n)
	c.out = v
	streamd.Emit(r.Key, v, r.Timestamp)
	return nil
}

func (c *conformance) OnTimer(ts int64, key []byte) error {
	streamd.Emit(key, []byte("timer"), ts)
	return nil
}

func (c *conformance) OnWatermark(ts int64) error {
	streamd.Emit(nil, []byte("wm"), ts)
	return nil
}

func (c *conformance) EndInput(input int) error {
	streamd.Emit(nil, []byte{'e', 'n', 'd', byte(input)}, streamd.NoTimestamp)
	return nil
}

func (c *conformance) Finish() error {
	streamd.Emit(nil, append([]byte("finish"), u64le(c.total)...), streamd.NoTimestamp)
	return nil
}

func (c *conformance) SnapshotState(id int64) error {
	totalLS.AddUint64(c.total)
	ckptLS.AddUint64(uint64(id))
	return nil
}

func (c *conformance) NotifyCheckpointComplete(int64) error {
	streamd.Log(streamd.LevelInfo, "notify")
	return nil
}

func (c *conformance) Close() error {
	streamd.Log(streamd.LevelInfo, "close")
	return nil
}

func init() { streamd.Register(&conformance{}) }

func main() {}
