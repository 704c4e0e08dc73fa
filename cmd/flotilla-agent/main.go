// Command flotilla-agent is the flotilla agent: it runs in a worker cluster, dials the
// hub over an outbound WebSocket tunnel, redeems the cluster's one-shot enrollment token
// for a credential of its own, applies the Kueue objects the hub sends and reports the
// cluster's GPUs. With dispatch on (the default) it also forwards, through the same
// tunnel, the requests the hub's MultiKueue makes of the worker's API server, under the
// chart's flotilla-dispatch ServiceAccount and only those MultiKueue needs
// (agent/proxy). It listens only for health probes and metrics.
//
// It is configured by the flotilla-agent chart's values file (the one `flotilla cluster
// add` writes), each setting overridable by a flag.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
)

// errReported is returned once the error was logged already.
var errReported = errors.New("reported")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv, func(ctx context.Context, cfg *config) error {
		return runAgent(ctx, cfg, os.Stderr, os.Getenv)
	})
	stop()
	os.Exit(code)
}

// starter runs the agent with a checked configuration; tests replace it.
type starter func(ctx context.Context, cfg *config) error

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string, start starter) int {
	cmd := newRootCommand(getenv, start)
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.ExecuteContext(ctx); err != nil {
		if !errors.Is(err, errReported) {
			fmt.Fprintln(stderr, "flotilla-agent:", err)
		}
		return 1
	}
	return 0
}

func newRootCommand(getenv func(string) string, start starter) *cobra.Command {
	var fv flagValues
	cmd := &cobra.Command{
		Use:   "flotilla-agent --values FILE [flags]",
		Short: "Run the flotilla agent in a worker cluster",
		Long: "flotilla-agent dials the flotilla hub, enrolls this worker cluster with its one-shot\n" +
			"enrollment token, applies the Kueue objects the hub sends and reports the cluster's GPUs.\n\n" +
			"Settings come from the flotilla-agent chart's values file (--values): hub.url,\n" +
			"cluster.tenant, cluster.name, cluster.identity, enrollment.token and the optional\n" +
			"agent.namespace, agent.credentialSecret, agent.caBundle (a file or inline PEM),\n" +
			"agent.heartbeat, agent.dcgmURL, agent.listen, agent.logLevel, dispatch.enabled,\n" +
			"components.install, components.serviceAccount, components.allowedRegistries and\n" +
			"components.requiredDigests (the values file only).\n" +
			"A flag overrides the file. The enrollment token has no flag, since flags show in\n" +
			"process listings: it is read from the values file or from --enrollment-token-file.",
		Version:       version.String("flotilla-agent"),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(fv, cmd.Flags().Changed, getenv)
			if err != nil {
				return err
			}
			err = start(cmd.Context(), cfg)
			if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
				return nil // SIGTERM or SIGINT: a clean shutdown
			}
			return err
		},
	}
	cmd.AddCommand(newResetCommand(getenv))
	cmd.SetVersionTemplate("{{.Version}}\n")
	f := cmd.Flags()
	f.SortFlags = false
	f.StringVar(&fv.values, "values", "", "the chart's values file holding the agent's settings")
	f.StringVar(&fv.hubURL, "hub-url", "", "the hub's address, wss://host[:port] (hub.url)")
	f.StringVar(&fv.identity, "identity", "", "the worker cluster's identity (cluster.identity)")
	f.StringVar(&fv.tokenFile, "enrollment-token-file", "", "a file holding the one-shot enrollment token, instead of enrollment.token")
	f.StringVar(&fv.namespace, "namespace", "", "the agent's namespace, where its credential Secret is kept (agent.namespace; default $"+namespaceEnv+", else "+defaultNamespace+")")
	f.StringVar(&fv.credentialSecret, "credential-secret", defaultCredentialSecret, "the Secret the agent keeps its credential in (agent.credentialSecret)")
	f.StringVar(&fv.caBundle, "ca-bundle", "", "a PEM file of the CAs that verify the hub's certificate, instead of the system's (agent.caBundle)")
	f.DurationVar(&fv.heartbeat, "heartbeat", defaultHeartbeat, "how often the agent pings the hub; silence for three intervals drops the tunnel (agent.heartbeat)")
	f.StringVar(&fv.dcgmURL, "dcgm-url", "", "a DCGM exporter's metrics URL, to report GPU health (agent.dcgmURL)")
	f.StringVar(&fv.listen, "listen", defaultListen, "the address of /healthz, /readyz and /metrics (agent.listen)")
	f.StringVar(&fv.kubeconfig, "kubeconfig", "", "a kubeconfig for the worker cluster (default: in-cluster, else $"+kubeconfigEnv+")")
	f.StringVar(&fv.logLevel, "log-level", "info", "debug, info, warn or error (agent.logLevel)")
	f.BoolVar(&fv.dispatch, "dispatch", true, "serve the hub's Kubernetes API proxy, through which the hub's MultiKueue dispatches jobs here (dispatch.enabled)")
	f.StringVar(&fv.dispatchClusterRole, "dispatch-cluster-role", "", "the ClusterRole of the dispatch identity's namespaced rules, which the agent binds in each workload namespace (dispatch.clusterRole)")
	f.BoolVar(&fv.installComponents, "install-components", true, "install and upgrade Kueue and JobSet where the fleet manages them (components.install); false where the cluster's team runs them")
	f.StringVar(&fv.componentsBinary, "components-binary", "", "the installer of Kueue and JobSet (default: "+components.BinaryName+" beside this executable)")
	f.StringVar(&fv.componentsSA, "components-service-account", "", "a ServiceAccount of the agent's namespace that the installer acts as (components.serviceAccount; default: the agent's own identity)")
	f.BoolVar(&fv.allowInsecureLoopback, "allow-insecure-loopback", false, "accept a ws:// hub URL to a loopback host, for a hub on this machine")
	return cmd
}
