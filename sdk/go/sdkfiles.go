//go:build !wasip1

package streamd

import "embed"

// SDKFiles holds this SDK module's own files (go.mod, README.md, the Go
// files of every package, tests and testdata included) as they were when the
// program that imports it was built. It is for tools, not operators:
// `streamd new go` writes a copy of the SDK into a new project from it, so the
// project builds without downloading the module. wasip1 builds (operators)
// leave it out.
//
//go:embed *
var SDKFiles embed.FS
