// Command failonce is a test guest for checkpointing and failover. It fails
// once, on the job's first attempt, when its subtask has processed fail_at
// records (config fail_at; 0 or absent: never), then behaves normally after
// the restart.
//
// With mode "count" it is a keyed running counter: for every record with key k
// it emits (k, "k=<count>") where count is k's running count held in keyed
// state, so an exactly-once run emits every count 1..n of every key exactly
// once. Otherwise (mode "map", the default) it passes every record on.
//
// With fail_notify K (0 or absent: never) it fails instead in its K-th
// notify_checkpoint_complete of attempt 0 (with no periodic checkpoints,
// the first notify is that of a stop's savepoint).
//
// With state_bytes N > 8 (count mode) each key's state is N bytes: the
// count, little-endian, padded (state of a realistic size for benchmarks).
//
// With poison V1,V2,... (config) a record whose value is one of them fails
// in every attempt, after its count was written (count mode), as
// poison_how says: "fail" (the default: an error), "panic", "exit" (WASI
// proc_exit) or "reject" (streamd.Reject, no failure): a test guest for
// on_error and dead letters.
//
// With sleep_us N each record takes at least N microseconds (time.Sleep; the
// operator needs allow_clock): a slow stage for back-pressure tests.
//
// It also keeps a split list state "seen" (records processed by the subtask
// since the first attempt), restored on open, so list state survives
// checkpoints too.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o failonce.wasm .
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	streamd "github.com/streamd/streamd/sdk/go"
)

var count = streamd.ValueState("count")

type failOnce struct {
	streamd.Base
	failAt  int64
	failNtf int64 // fail_notify
	notifys int64
	attempt int
	keyed   bool
	seen    uint64 // records seen, restored from list state
	n       int64  // records processed in this attempt
	buf     []byte
	state   []byte // state_bytes > 8: the value written per key
	poison  map[string]bool
	how     string
	sleep   time.Duration // sleep_us per record
}

func (f *failOnce) Open(ctx *streamd.Context) error {
	var err error
	if f.failAt, err = ctx.Config.Int("fail_at", 0); err != nil {
		return err
	}
	if f.failNtf, err = ctx.Config.Int("fail_notify", 0); err != nil {
		return err
	}
	if n, err := ctx.Config.Int("state_bytes", 0); err != nil {
		return err
	} else if n > 8 {
		f.state = make([]byte, n)
	}
	if us, err := ctx.Config.Int("sleep_us", 0); err != nil {
		return err
	} else {
		f.sleep = time.Duration(us) * time.Microsecond
	}
	f.attempt = ctx.Attempt
	if p := ctx.Config.String("poison", ""); p != "" {
		f.poison = map[string]bool{}
		for _, v := range strings.Split(p, ",") {
			f.poison[v] = true
		}
	}
	switch f.how = ctx.Config.String("poison_how", "fail"); f.how {
	case "fail", "panic", "exit", "reject":
	default:
		return fmt.Errorf("failonce: unknown poison_how %q (want fail, panic, exit or reject)", f.how)
	}
	switch m := ctx.Config.String("mode", "map"); m {
	case "map":
	case "count":
		f.keyed = true
	default:
		return fmt.Errorf("failonce: unknown mode %q (want map or count)", m)
	}
	if ctx.Restored {
		for _, e := range streamd.ListState("seen", streamd.Split).Entries() {
			if len(e) == 8 {
				f.seen += binary.LittleEndian.Uint64(e)
			}
		}
	}
	return nil
}

func (f *failOnce) ProcessElement(r streamd.Record, _ int) error {
	f.n++
	f.seen++
	if f.sleep > 0 {
		time.Sleep(f.sleep)
	}
	if f.attempt == 0 && f.failAt > 0 && f.n == f.failAt {
		return fmt.Errorf("failonce: injected failure at record %d of attempt 0", f.n)
	}
	if !f.keyed {
		if f.poison[string(r.Value)] {
			return f.poisoned(r)
		}
		streamd.EmitRecord(r)
		return nil
	}
	var c uint64
	if f.state != nil {
		if v, ok := count.Get(r.Key); ok && len(v) >= 8 {
			c = binary.LittleEndian.Uint64(v)
		}
		c++
		binary.LittleEndian.PutUint64(f.state, c)
		count.Put(r.Key, f.state)
	} else {
		c, _ = count.GetUint64(r.Key)
		c++
		count.PutUint64(r.Key, c)
	}
	if f.poison[string(r.Value)] {
		return f.poisoned(r)
	}
	f.buf = append(f.buf[:0], r.Key...)
	f.buf = append(f.buf, '=')
	f.buf = fmt.Appendf(f.buf, "%d", c)
	streamd.Emit(r.Key, f.buf, r.Timestamp)
	return nil
}

// poisoned fails on poison record r as poison_how says.
func (f *failOnce) poisoned(r streamd.Record) error {
	msg := "failonce: poison record " + string(r.Value)
	switch f.how {
	case "panic":
		panic(msg)
	case "exit":
		os.Exit(3)
	case "reject":
		return streamd.Reject(errors.New(msg))
	}
	return errors.New(msg)
}

func (f *failOnce) SnapshotState(int64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], f.seen)
	streamd.ListState("seen", streamd.Split).Add(b[:])
	return nil
}

func (f *failOnce) NotifyCheckpointComplete(id int64) error {
	f.notifys++
	if f.attempt == 0 && f.failNtf > 0 && f.notifys == f.failNtf {
		return fmt.Errorf("failonce: injected failure in notify_checkpoint_complete(%d) of attempt 0", id)
	}
	return nil
}

func init() { streamd.Register(&failOnce{}) }

func main() {}
