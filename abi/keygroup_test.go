package abi

import (
	"fmt"
	"testing"
)

// The ranges of all subtasks tile [0, maxParallelism) without gaps or overlap,
// and SubtaskForKeyGroup agrees with RangeForSubtask: hash partitioning and
// keyed state see the same ownership.
func TestKeyGroupRangesTile(t *testing.T) {
	for _, maxP := range []int{1, 7, 128, 1000} {
		for p := 1; p <= maxP && p <= 40; p++ {
			next := 0
			for i := 0; i < p; i++ {
				r := RangeForSubtask(i, maxP, p)
				if r.Start != next {
					t.Fatalf("maxP=%d p=%d subtask %d: range %v starts at %d, want %d", maxP, p, i, r, r.Start, next)
				}
				for kg := r.Start; kg <= r.End; kg++ {
					if got := SubtaskForKeyGroup(kg, maxP, p); got != i {
						t.Fatalf("maxP=%d p=%d: key group %d owned by %d per range, %d per SubtaskForKeyGroup", maxP, p, kg, i, got)
					}
				}
				next = r.End + 1
			}
			if next != maxP {
				t.Fatalf("maxP=%d p=%d: ranges end at %d", maxP, p, next)
			}
		}
	}
}

func TestKeyGroupSpread(t *testing.T) {
	counts := make([]int, 128)
	for i := 0; i < 128000; i++ {
		counts[KeyGroup([]byte(fmt.Sprintf("key-%d", i)), 128)]++
	}
	for kg, n := range counts {
		if n < 700 || n > 1300 {
			t.Errorf("key group %d got %d of 128000 keys; the hash spreads badly", kg, n)
		}
	}
}
