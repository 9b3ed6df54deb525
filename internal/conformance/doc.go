// Package conformance runs one set of lifecycle scenarios over every
// conformance guest (hand-written WAT, Go SDK, Rust SDK): all three implement
// the same operator, specified in guests/SPEC.md, so they must produce the
// same records, state and errors through the host.
package conformance
