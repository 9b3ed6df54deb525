package streamd

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"sort"
	"testing"
)

// The SDK does not import the host's abi package (this module depends on the
// standard library only), so its codec tests read frames the abi package
// encoded and decoded: testdata/frames.json, written and kept current by
// sdk/gotest's TestGoldenFrames in the root module.

type goldenFrames struct {
	Batches []struct {
		Frame   []byte   `json:"frame"`
		Valid   bool     `json:"valid"`
		Records []Record `json:"records"`
	} `json:"batches"`
	Contexts []struct {
		Frame   []byte `json:"frame"`
		Valid   bool   `json:"valid"`
		Context *struct {
			Job, Operator                                            string
			Subtask, Parallelism, MaxParallelism, Attempt, NumInputs int
			Restored                                                 bool
			Config                                                   map[string]string
		} `json:"context"`
	} `json:"contexts"`
}

func loadGolden(t testing.TB) *goldenFrames {
	t.Helper()
	b, err := os.ReadFile("testdata/frames.json")
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFrames
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("testdata/frames.json: %v", err)
	}
	return &g
}

// batch encodes records with the SDK's own encoder (checked against the
// golden frames by TestOutFrame).
func batch(recs ...Record) []byte {
	var o outFrame
	for _, r := range recs {
		o.add(r.Key, r.Value, r.Timestamp)
	}
	if f := o.frame(); f != nil {
		return bytes.Clone(f)
	}
	return []byte{0, 0, 0, 0}
}

// decodeFrame decodes a batch with the SDK's decoder, copying the records.
func decodeFrame(frame []byte) ([]Record, error) {
	n, err := checkBatch(frame)
	if err != nil {
		return nil, err
	}
	recs := make([]Record, 0, n)
	off := 4
	var r Record
	for i := 0; i < n; i++ {
		r, off = nextRecord(frame, off)
		recs = append(recs, Record{Key: bytes.Clone(r.Key), Value: bytes.Clone(r.Value), Timestamp: r.Timestamp})
	}
	return recs, nil
}

func recordSize(r Record) int { return recordHeader + len(r.Key) + len(r.Value) }

func frameSize(recs []Record) int {
	n := 4
	for _, r := range recs {
		n += recordSize(r)
	}
	return n
}

func sameRecords(a, b []Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Key, b[i].Key) || !bytes.Equal(a[i].Value, b[i].Value) || a[i].Timestamp != b[i].Timestamp {
			return false
		}
	}
	return true
}

// appendContext encodes an open-context frame as abi/ABI.md lays it out, the
// config in sorted key order (checked against the golden frames by
// TestDecodeContext).
func appendContext(dst []byte, c Context) []byte {
	le := binary.LittleEndian
	dst = le.AppendUint32(dst, abiVersion)
	for _, v := range []int{c.Subtask, c.Parallelism, c.MaxParallelism, c.Attempt, c.NumInputs} {
		dst = le.AppendUint32(dst, uint32(v))
	}
	var flags uint32
	if c.Restored {
		flags = 1
	}
	dst = le.AppendUint32(dst, flags)
	str := func(s string) { dst = le.AppendUint32(dst, uint32(len(s))); dst = append(dst, s...) }
	str(c.Job)
	str(c.Operator)
	keys := make([]string, 0, len(c.Config))
	for k := range c.Config {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	dst = le.AppendUint32(dst, uint32(len(keys)))
	for _, k := range keys {
		str(k)
		str(c.Config[k])
	}
	return dst
}
