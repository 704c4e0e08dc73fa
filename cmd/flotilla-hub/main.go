// Command flotilla-hub is the flotilla hub: it follows fleet repositories and serves the
// agents of their worker clusters.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := newCommand().ExecuteContext(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "flotilla-hub:", err)
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var configFile string
	cmd := &cobra.Command{
		Use:   "flotilla-hub --config FILE",
		Short: "The flotilla hub",
		Long: "flotilla-hub follows the fleet repositories named in its configuration, keeps a\n" +
			"WorkerCluster per cluster on the hub cluster, serves the agents' tunnels and\n" +
			"reports each cluster's readiness as commit statuses.",
		Version:       version.String("flotilla-hub"),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := LoadConfig(configFile)
			if err != nil {
				return err
			}
			cfg.LeaderElection.PodName, cfg.LeaderElection.PodNamespace = os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
			log := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil))
			return run(cmd.Context(), cfg, log)
		},
	}
	cmd.SetVersionTemplate("{{.Version}}\n")
	cmd.Flags().StringVar(&configFile, "config", "", "the hub's configuration file (required)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}
