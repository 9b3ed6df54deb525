package kafka

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
)

// Partition names one partition of a topic: a split of the source.
type Partition struct {
	Topic     string
	Partition int32
}

func (p Partition) String() string { return fmt.Sprintf("%s/%d", p.Topic, p.Partition) }

// SubtaskFor is the source subtask, of parallelism, that reads partition p.
// It depends on p and parallelism only, so every subtask computes the same
// assignment without talking to the others, and a partition found while
// running is read by exactly one of them: the partitions of a topic go round
// robin over the subtasks, from a start that depends on the topic's name
// (so that several single-partition topics do not all land on subtask 0).
func SubtaskFor(p Partition, parallelism int) int {
	h := fnv.New32a()
	h.Write([]byte(p.Topic))
	start := int(h.Sum32() % uint32(parallelism))
	return (start + int(p.Partition)) % parallelism
}

// positionVersion is the first byte of an encoded position.
const positionVersion = 1

// EncodePosition encodes a source position: the next offset to read of each
// partition. Layout (big-endian): u8 version, u32 count, then per partition
// (sorted by topic and partition): u16 topic length, topic, i32 partition,
// i64 next offset.
func EncodePosition(offsets map[Partition]int64) []byte {
	keys := make([]Partition, 0, len(offsets))
	for p := range offsets {
		keys = append(keys, p)
	}
	slices.SortFunc(keys, func(a, b Partition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	b := []byte{positionVersion}
	b = binary.BigEndian.AppendUint32(b, uint32(len(keys)))
	for _, p := range keys {
		b = binary.BigEndian.AppendUint16(b, uint16(len(p.Topic)))
		b = append(b, p.Topic...)
		b = binary.BigEndian.AppendUint32(b, uint32(p.Partition))
		b = binary.BigEndian.AppendUint64(b, uint64(offsets[p]))
	}
	return b
}

// DecodePosition decodes EncodePosition's output.
func DecodePosition(b []byte) (map[Partition]int64, error) {
	bad := func(why string) (map[Partition]int64, error) {
		return nil, fmt.Errorf("kafka: bad source position: %s", why)
	}
	if len(b) < 5 || b[0] != positionVersion {
		return bad("no version header")
	}
	n := binary.BigEndian.Uint32(b[1:])
	b = b[5:]
	out := make(map[Partition]int64, min(n, 1<<16))
	for i := uint32(0); i < n; i++ {
		if len(b) < 2 {
			return bad("truncated")
		}
		l := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+l+12 {
			return bad("truncated")
		}
		p := Partition{Topic: string(b[2 : 2+l]), Partition: int32(binary.BigEndian.Uint32(b[2+l:]))}
		off := int64(binary.BigEndian.Uint64(b[2+l+4:]))
		b = b[2+l+12:]
		if p.Partition < 0 || off < 0 {
			return bad(fmt.Sprintf("partition %s at offset %d", p, off))
		}
		if _, dup := out[p]; dup {
			return bad(fmt.Sprintf("partition %s twice", p))
		}
		out[p] = off
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return out, nil
}

// RedistributePositions spreads the positions of a source's old subtasks
// (nil entries for subtasks without one) over newParallelism subtasks, as
// key groups are on rescale: new subtask i gets the offsets of the
// partitions SubtaskFor gives it. Every result is non-nil (a restored
// subtask, even one without partitions, starts partitions it finds later
// at their earliest). A partition in two old positions is an error.
func RedistributePositions(old [][]byte, newParallelism int) ([][]byte, error) {
	if newParallelism < 1 {
		return nil, fmt.Errorf("kafka: redistribute positions: parallelism %d", newParallelism)
	}
	out := make([]map[Partition]int64, newParallelism)
	for i := range out {
		out[i] = map[Partition]int64{}
	}
	seen := map[Partition]int{}
	for j, b := range old {
		if b == nil {
			continue
		}
		m, err := DecodePosition(b)
		if err != nil {
			return nil, fmt.Errorf("kafka: redistribute positions: subtask %d: %w", j, err)
		}
		for p, off := range m {
			if k, dup := seen[p]; dup {
				return nil, fmt.Errorf("kafka: redistribute positions: partition %s is in the positions of subtasks %d and %d", p, k, j)
			}
			seen[p] = j
			out[SubtaskFor(p, newParallelism)][p] = off
		}
	}
	res := make([][]byte, newParallelism)
	for i, m := range out {
		res[i] = EncodePosition(m)
	}
	return res, nil
}

var errClosed = errors.New("kafka: source closed")
