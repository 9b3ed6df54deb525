package streamdtest

// Key groups as the host computes them (abi/keygroup.go, Flink's
// KeyGroupRangeAssignment with streamd's hash). The copy must match the
// host's: sdk/gotest's TestKeyGroupsMatchHost checks it against the abi
// package, and TestKeyHashGolden here against fixed values.

// keyHash is the 32-bit hash of a key: FNV-1a followed by murmur3's finalizer.
func keyHash(key []byte) uint32 {
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
	return int(keyHash(key) % uint32(maxParallelism))
}

// SubtaskOf returns the subtask of an operator at parallelism that owns key:
// the subtask a hash edge sends it to.
func SubtaskOf(key []byte, maxParallelism, parallelism int) int {
	return KeyGroup(key, maxParallelism) * parallelism / maxParallelism
}

// keyGroupRange returns the first and last key group of subtask.
func keyGroupRange(subtask, maxParallelism, parallelism int) (int, int) {
	return (subtask*maxParallelism + parallelism - 1) / parallelism, ((subtask+1)*maxParallelism - 1) / parallelism
}
