// Command flotilla-hub is the flotilla hub: it follows fleet repositories and serves the agents of their worker clusters.
package main

import (
	"os"

	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
)

func main() {
	cmd := version.Stub("flotilla-hub", "The flotilla hub")
	if err := cmd.Execute(); err != nil {
		cmd.PrintErrln("flotilla-hub:", err)
		os.Exit(1)
	}
}
