// Command flotilla-agent is the flotilla agent: it runs in a worker cluster, dials the hub and applies the cluster's desired state.
package main

import (
	"os"

	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
)

func main() {
	cmd := version.Stub("flotilla-agent", "The flotilla agent")
	if err := cmd.Execute(); err != nil {
		cmd.PrintErrln("flotilla-agent:", err)
		os.Exit(1)
	}
}
