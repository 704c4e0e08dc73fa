// Command flotilla is the fleet engineers' CLI: it validates a fleet repository and
// shows what the hub would send to each worker cluster.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
)

// errReported is returned by commands that already told the user what went wrong.
var errReported = errors.New("reported")

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newRootCommand()
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.ExecuteContext(ctx); err != nil {
		if !errors.Is(err, errReported) {
			fmt.Fprintln(stderr, "flotilla:", err)
		}
		return 1
	}
	return 0
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "flotilla",
		Short: "Work with a flotilla fleet repository and see its clusters on the hub",
		Long: "flotilla creates and validates a fleet repository of GPU worker clusters, adds,\n" +
			"cordons and removes clusters, and renders the Kueue objects the hub sends to each of\n" +
			"them. With the hub's kubeconfig it shows what the hub knows of every cluster; from\n" +
			"the fleet repository, the commit statuses the hub recorded as git notes.",
		Version:       version.String("flotilla"),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	// kubectl's flags, before or after the subcommand, for the commands that read the hub.
	var hub hubFlags
	hub.register(root.PersistentFlags())
	root.AddCommand(newValidateCommand(), newRenderCommand(), newFleetCommand(), newClusterCommand(&hub), newDeviceCommand(&hub),
		newCommitCommand(), newDeprecatedStatusCommand())
	return root
}
