package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/abi"
)

// version is set at build time with -ldflags "-X main.version=v0.1.0".
var version = "dev"

func (c *cli) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print streamd's version, the guest ABI version and the wazero version",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(c.stdout, versionString())
			return err
		},
	}
}

// buildVersion is the version set at build time, else the module's
// version, else "dev".
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}

func versionString() string {
	v, commit, wazero := buildVersion(), "", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				commit = s.Value[:12]
			}
			if s.Key == "vcs.modified" && s.Value == "true" && commit != "" {
				commit += "+dirty"
			}
		}
		for _, d := range bi.Deps {
			if d.Path == "github.com/tetratelabs/wazero" {
				wazero = d.Version
			}
		}
	}
	s := "streamd " + v
	if commit != "" {
		s += " (" + commit + ")"
	}
	return fmt.Sprintf("%s abi v%d %s wazero %s", s, abi.Version, runtime.Version(), wazero)
}
