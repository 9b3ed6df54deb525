//go:build !wasip1

package main

// stateTTL needs the Wasm host (see ttl_wasip1.go).
func stateTTL(string, int64) { panic("mstate: state_ttl needs GOOS=wasip1") }
