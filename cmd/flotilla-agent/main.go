// Command flotilla-agent is the flotilla agent: it runs in a worker cluster, dials the hub and applies the cluster's desired state.
package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
)

func main() {
	cmd := &cobra.Command{
		Use:           "flotilla-agent",
		Short:         "The flotilla agent",
		Version:       version.String("flotilla-agent"),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.SetVersionTemplate("{{.Version}}\n")
	if err := cmd.Execute(); err != nil {
		cmd.PrintErrln("flotilla-agent:", err)
		os.Exit(1)
	}
}
