package main

import (
	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/connector"
)

// The connectors' configuration keys (connector.RegisterSetting, such as
// kafka.brokers) are keys of the configuration file, STREAMD_ variables
// and, when they name a flag, flags of run, deploy, host and server; their
// values go to the connectors (runtime.Options.ConnectorSettings, the
// transform schemes' SchemeEnv).

// settingKeys are the connector settings' keys (read when the
// configuration is, so that every init function has registered its own).
func settingKeys() []string {
	var out []string
	for _, s := range connector.Settings() {
		out = append(out, s.Key)
	}
	return out
}

// connectorFlags adds the flag of every connector setting that has one to
// cmd and returns them, to be bound when cmd runs.
func (c *cli) connectorFlags(cmd *cobra.Command) []flagKey {
	var out []flagKey
	for _, s := range connector.Settings() {
		if s.Flag == "" {
			continue
		}
		cmd.Flags().String(s.Flag, "", s.Usage+" ("+s.Key+")")
		out = append(out, flagKey{s.Flag, s.Key})
	}
	return out
}

// connectorSettings are the connector settings that the configuration, the
// environment or a flag sets.
func (c *cli) connectorSettings() map[string]string {
	m := map[string]string{}
	for _, s := range connector.Settings() {
		if v := c.v.GetString(s.Key); v != "" {
			m[s.Key] = v
		}
	}
	return m
}
