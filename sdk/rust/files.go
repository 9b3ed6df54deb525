// Package rustsdk gives the Rust SDK's crate files to Go tools: `streamd new
// rust` writes a copy of the crate into a new project from Files, so the
// project builds offline (the crate is not published). The crate itself is
// Cargo.toml and src/; the Go tests of this directory run it through the host.
package rustsdk

import "embed"

// Files holds the crate's Cargo.toml, README.md and src/ as they were when
// the program that imports this package was built.
//
//go:embed Cargo.toml README.md all:src
var Files embed.FS
