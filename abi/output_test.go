package abi

import (
	"strings"
	"testing"
)

func TestCheckOutputName(t *testing.T) {
	for _, ok := range []string{"late", "a", "side-1_B", strings.Repeat("x", MaxOutputNameLen)} {
		if err := CheckOutputName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for name, want := range map[string]string{
		"":                                      "empty side-output name",
		"a.b":                                   `byte 1 ('.') is not a letter, digit, '-' or '_'`,
		"é":                                     `byte 0`,
		strings.Repeat("x", MaxOutputNameLen+1): "over 128",
	} {
		if err := CheckOutputName(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", name, err, want)
		}
	}
}
