// Command flotilla-hub is the flotilla hub: it follows fleet repositories and serves the agents of their worker clusters.
package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
)

func main() {
	cmd := &cobra.Command{
		Use:           "flotilla-hub",
		Short:         "The flotilla hub",
		Version:       version.String("flotilla-hub"),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.SetVersionTemplate("{{.Version}}\n")
	if err := cmd.Execute(); err != nil {
		cmd.PrintErrln("flotilla-hub:", err)
		os.Exit(1)
	}
}
