// Package gotest holds the tests of the Go SDK (sdk/go, its own module) that
// need the streamd host: real guests built with the SDK run through the host
// and the job runtime, and the golden frames (sdk/go/testdata) that let the
// SDK's own tests check its codecs against the host's abi package without
// importing it. TestKeyGroupsMatchHost checks the streamdtest harness's copy
// of the key-group hash against abi.
package gotest
