package abi

import "fmt"

// Key groups are the unit of keyed state: a key belongs to exactly one key
// group, and each subtask of an operator owns a contiguous range of key groups.
// Hash partitioning sends a record to the subtask that owns its key's group, so
// a subtask only ever sees keys of its own range. The functions follow Flink's
// KeyGroupRangeAssignment, with our own hash.

// KeyHash is the 32-bit hash of a key: FNV-1a followed by murmur3's finalizer.
func KeyHash(key []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range key {
		h ^= uint32(c)
		h *= 16777619
	}
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// KeyGroup returns the key group of key among maxParallelism groups.
func KeyGroup(key []byte, maxParallelism int) int {
	return int(KeyHash(key) % uint32(maxParallelism))
}

// SubtaskForKeyGroup returns the subtask that owns key group kg.
func SubtaskForKeyGroup(kg, maxParallelism, parallelism int) int {
	return kg * parallelism / maxParallelism
}

// KeyGroupRange is the inclusive range [Start, End] of key groups of a subtask.
type KeyGroupRange struct{ Start, End int }

// Contains reports whether kg lies in r.
func (r KeyGroupRange) Contains(kg int) bool { return kg >= r.Start && kg <= r.End }

func (r KeyGroupRange) String() string { return fmt.Sprintf("[%d,%d]", r.Start, r.End) }

// RangeForSubtask returns the key groups owned by subtask of parallelism.
func RangeForSubtask(subtask, maxParallelism, parallelism int) KeyGroupRange {
	start := (subtask*maxParallelism + parallelism - 1) / parallelism
	end := ((subtask+1)*maxParallelism - 1) / parallelism
	return KeyGroupRange{start, end}
}
