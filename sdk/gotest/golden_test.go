package gotest

import (
	"bytes"
	"encoding/json"
	"flag"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/streamd/streamd/abi"
)

var rewrite = flag.Bool("rewrite", false, "rewrite sdk/go/testdata/frames.json from the abi package")

// goldenPath is read by the SDK's codec tests (sdk/go/codec_test.go).
const goldenPath = "../go/testdata/frames.json"

// golden is the schema of frames.json; the SDK's tests declare the same.
type golden struct {
	Note     string          `json:"note"`
	Batches  []goldenBatch   `json:"batches"`
	Contexts []goldenContext `json:"contexts"`
}

type goldenBatch struct {
	Frame   []byte       `json:"frame"`
	Valid   bool         `json:"valid"`             // abi.DecodeBatch accepts it
	Records []abi.Record `json:"records,omitempty"` // what it decodes to
}

type goldenContext struct {
	Frame   []byte           `json:"frame"`
	Valid   bool             `json:"valid"` // abi.DecodeOpenContext accepts it
	Context *abi.OpenContext `json:"context,omitempty"`
}

func randomRecords(rng *rand.Rand, n int) []abi.Record {
	recs := make([]abi.Record, n)
	for i := range recs {
		var key []byte
		if rng.IntN(3) > 0 {
			key = make([]byte, rng.IntN(8)+1)
			for j := range key {
				key[j] = byte(rng.Uint32())
			}
		}
		val := make([]byte, rng.IntN(24))
		for j := range val {
			val[j] = byte(rng.Uint32())
		}
		ts := rng.Int64() - math.MaxInt64/2
		if rng.IntN(5) == 0 {
			ts = abi.NoTimestamp
		}
		recs[i] = abi.Record{Key: key, Value: val, Timestamp: ts}
	}
	return recs
}

func batchCase(frame []byte) goldenBatch {
	recs, err := abi.DecodeBatch(frame, nil)
	if err != nil {
		return goldenBatch{Frame: frame}
	}
	return goldenBatch{Frame: frame, Valid: true, Records: recs}
}

func contextCase(frame []byte) goldenContext {
	c, err := abi.DecodeOpenContext(frame)
	if err != nil {
		return goldenContext{Frame: frame}
	}
	c.ConfigKeys = nil
	return goldenContext{Frame: frame, Valid: true, Context: &c}
}

// makeGolden encodes and decodes frames with the host's codec: valid batches,
// then batches mutated at random (a byte flipped, truncated, trailing bytes)
// with the host's verdict, then open contexts, valid and malformed.
func makeGolden() golden {
	g := golden{Note: "generated from the abi package by `go test ./sdk/gotest -run TestGoldenFrames -rewrite`; do not edit"}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 100} {
		g.Batches = append(g.Batches, batchCase(abi.AppendBatch(nil, randomRecords(rng, n))))
	}
	for i := 0; i < 800; i++ {
		frame := abi.AppendBatch(nil, randomRecords(rng, rng.IntN(5)))
		switch rng.IntN(4) {
		case 0: // flip a byte, often a length
			frame[rng.IntN(len(frame))] = byte(rng.Uint32())
		case 1: // truncate
			frame = frame[:rng.IntN(len(frame)+1)]
		case 2: // trailing bytes
			frame = append(frame, make([]byte, rng.IntN(3)+1)...)
		}
		g.Batches = append(g.Batches, batchCase(frame))
	}

	// Records with headers, valid and mutated, from a second generator so
	// that the frames above stay as they were.
	hrng := rand.New(rand.NewPCG(3, 4))
	withHeaders := func(n int) []abi.Record {
		recs := randomRecords(hrng, n)
		for i := range recs {
			if hrng.IntN(3) == 0 {
				continue
			}
			var h []byte
			for range hrng.IntN(3) + 1 {
				v := make([]byte, hrng.IntN(6))
				for j := range v {
					v[j] = byte(hrng.Uint32())
				}
				h = abi.AppendHeader(h, []string{"trace", "k", "", "content-type"}[hrng.IntN(4)], v)
			}
			recs[i].Headers = h
		}
		return recs
	}
	for _, n := range []int{1, 3, 20} {
		g.Batches = append(g.Batches, batchCase(abi.AppendBatch(nil, withHeaders(n))))
	}
	for i := 0; i < 400; i++ {
		frame := abi.AppendBatch(nil, withHeaders(hrng.IntN(4)+1))
		switch hrng.IntN(4) {
		case 0:
			frame[hrng.IntN(len(frame))] = byte(hrng.Uint32())
		case 1:
			frame = frame[:hrng.IntN(len(frame)+1)]
		case 2:
			frame = append(frame, make([]byte, hrng.IntN(3)+1)...)
		}
		g.Batches = append(g.Batches, batchCase(frame))
	}

	full := abi.AppendOpenContext(nil, abi.OpenContext{
		Job: "wc", Operator: "count", Subtask: 2, Parallelism: 4, MaxParallelism: 128,
		Attempt: 3, NumInputs: 2, Restored: true,
		Config: map[string]string{"size_ms": "5000", "name": "x", "empty": ""},
	})
	wrongVersion := bytes.Clone(full)
	wrongVersion[0] = 2
	for _, frame := range [][]byte{
		full,
		abi.AppendOpenContext(nil, abi.OpenContext{Job: "j", Parallelism: 1}),
		abi.AppendOpenContext(nil, abi.OpenContext{Job: "j", Operator: "op", Subtask: 1, Parallelism: 2, MaxParallelism: 128,
			NumInputs: 1, Restored: true, Config: map[string]string{"k": "v"}}),
		nil, full[:10], full[:len(full)-1], append(bytes.Clone(full), 0), wrongVersion,
	} {
		g.Contexts = append(g.Contexts, contextCase(frame))
	}
	return g
}

// TestGoldenFrames checks that sdk/go/testdata/frames.json is what the abi
// package produces today; -rewrite regenerates it after a codec change.
func TestGoldenFrames(t *testing.T) {
	want, err := marshalGolden(makeGolden())
	if err != nil {
		t.Fatal(err)
	}
	if *rewrite {
		if err := os.WriteFile(goldenPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatalf("%v (generate it with -rewrite)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: the abi package encodes or decodes differently now; regenerate it with `go test ./sdk/gotest -run TestGoldenFrames -rewrite` and check the SDK's tests", goldenPath)
	}
}

// marshalGolden writes one case per line, so that a diff shows which changed.
func marshalGolden(g golden) ([]byte, error) {
	var b bytes.Buffer
	note, err := json.Marshal(g.Note)
	if err != nil {
		return nil, err
	}
	b.WriteString("{\"note\": " + string(note) + ",\n\"batches\": [\n")
	for i, c := range g.Batches {
		if err := appendCase(&b, c, i == len(g.Batches)-1); err != nil {
			return nil, err
		}
	}
	b.WriteString("],\n\"contexts\": [\n")
	for i, c := range g.Contexts {
		if err := appendCase(&b, c, i == len(g.Contexts)-1); err != nil {
			return nil, err
		}
	}
	b.WriteString("]}\n")
	return b.Bytes(), nil
}

func appendCase(b *bytes.Buffer, c any, last bool) error {
	j, err := json.Marshal(c)
	if err != nil {
		return err
	}
	b.Write(j)
	if !last {
		b.WriteByte(',')
	}
	b.WriteByte('\n')
	return nil
}
