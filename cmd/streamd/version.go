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
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print streamd's version, the guest ABI version and the wazero version",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asJSON {
				return c.printJSON(versionInfo())
			}
			_, err := fmt.Fprintln(c.stdout, versionString())
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"version", "commit", "abi", "go", "wazero"}`)
	return cmd
}

// buildInfo is what version says, as `version --json` prints it.
type buildInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"` // 12 hex digits, "+dirty" for a modified tree
	ABI     int    `json:"abi"`
	Go      string `json:"go"`
	Wazero  string `json:"wazero"`
}

func versionInfo() buildInfo {
	info := buildInfo{Version: buildVersion(), ABI: abi.Version, Go: runtime.Version(), Wazero: "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				info.Commit = s.Value[:12]
			}
			if s.Key == "vcs.modified" && s.Value == "true" && info.Commit != "" {
				info.Commit += "+dirty"
			}
		}
		for _, d := range bi.Deps {
			if d.Path == "github.com/tetratelabs/wazero" {
				info.Wazero = d.Version
			}
		}
	}
	return info
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
	info := versionInfo()
	s := "streamd " + info.Version
	if info.Commit != "" {
		s += " (" + info.Commit + ")"
	}
	return fmt.Sprintf("%s abi v%d %s wazero %s", s, info.ABI, info.Go, info.Wazero)
}
