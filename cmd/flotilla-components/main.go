// Command flotilla-components installs, upgrades and uninstalls the components flotilla
// runs on a worker cluster, Kueue and JobSet, with Helm and the charts embedded in it
// (agent/components/installer).
//
// It is a separate, short-lived binary, shipped beside flotilla-agent, which runs it as a
// subprocess only while components change. Helm and the charts are most of this binary,
// and a Go program pays for what it links in resident memory from the start: linked into
// the long-running agent they alone would take more than its whole memory budget, for
// work it does a few times in a cluster's life. A process that exits gives it all back.
//
// The agent writes a components.Request as JSON on standard input: the components'
// spec, the worker's image policy, which the binary checks the spec against again before
// it installs anything, and, when the agent has one, the worker's kubeconfig, which thus
// never touches a disk or a process listing. Without one the binary uses its pod's service account,
// else $KUBECONFIG. It writes a components.Report as JSON on standard output, and logs as
// JSON lines on standard error. It exits 0 whenever it wrote a report, also one of
// refused or failed components; otherwise 1, with the reason logged.
//
//	flotilla-components apply < request.json
//	flotilla-components uninstall [--dry-run] < request.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"helm.sh/helm/v4/pkg/kube"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
	"github.com/flotilla-gitops/flotilla/cmd/internal/version"
	"github.com/flotilla-gitops/flotilla/cmd/internal/workerconfig"
)

// maxRequest bounds what is read of standard input: a spec and a kubeconfig.
const maxRequest = 1 << 20

// errReported is returned once the error was logged already.
var errReported = errors.New("reported")

func main() {
	// Helm names its field manager after the executable unless told; a renamed or
	// wrapped binary must still show up as flotilla-components in managedFields.
	kube.ManagedFieldsManager = components.BinaryName
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	cmd := newRootCommand(stdin, getenv)
	cmd.SetArgs(args)
	cmd.SetIn(stdin)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.ExecuteContext(ctx); err != nil {
		if !errors.Is(err, errReported) {
			fmt.Fprintln(stderr, "flotilla-components:", err)
		}
		return 1
	}
	return 0
}

func newRootCommand(stdin io.Reader, getenv func(string) string) *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:   components.BinaryName + " apply|uninstall",
		Short: "Install, upgrade and uninstall Kueue and JobSet on a worker cluster with Helm",
		Long: components.BinaryName + " is run by flotilla-agent while a worker's components change. It reads a\n" +
			"request (JSON) on standard input, writes its report (JSON) on standard output and logs\n" +
			"(JSON lines) on standard error. The request's kubeconfig, if any, reaches the worker;\n" +
			"else the pod's service account, else $" + workerconfig.KubeconfigEnv + ".",
		Version:       version.String(components.BinaryName),
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")

	// do runs one command: it reads the request, connects, and writes the report.
	do := func(cmd *cobra.Command, f func(context.Context, *installer.Installer, components.Request) (components.Report, error)) error {
		log, err := newLogger(cmd.ErrOrStderr(), logLevel)
		if err != nil {
			return err
		}
		// client-go logs through klog; through slog its lines stay JSON.
		klog.SetSlogLogger(log)
		fail := func(msg string, err error) error {
			log.ErrorContext(cmd.Context(), msg, "error", err)
			return errReported
		}
		req, err := readRequest(stdin)
		if err != nil {
			return fail("reading the request on standard input", err)
		}
		cfg, err := restConfig(req.KubeConfig, getenv)
		if err != nil {
			return fail("finding the worker's API server", err)
		}
		rep, err := f(cmd.Context(), &installer.Installer{Config: cfg, Log: log, Images: req.Images}, req)
		if err != nil {
			return fail(cmd.Name()+" made no report", err)
		}
		if err := json.NewEncoder(cmd.OutOrStdout()).Encode(rep); err != nil {
			return fail("writing the report", err)
		}
		return nil
	}

	apply := &cobra.Command{
		Use:   "apply",
		Short: "Install or upgrade the components the request's spec names",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return do(cmd, func(ctx context.Context, in *installer.Installer, req components.Request) (components.Report, error) {
				return in.Apply(ctx, req.Spec)
			})
		},
	}
	var dryRun bool
	uninstall := &cobra.Command{
		Use:   "uninstall [--dry-run]",
		Short: "Remove the Helm releases flotilla installed, never a CRD",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return do(cmd, func(ctx context.Context, in *installer.Installer, req components.Request) (components.Report, error) {
				return in.Uninstall(ctx, dryRun || req.DryRun)
			})
		},
	}
	uninstall.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be removed, and remove nothing")
	root.AddCommand(apply, uninstall)
	return root
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func readRequest(r io.Reader) (components.Request, error) {
	var req components.Request
	data, err := io.ReadAll(io.LimitReader(r, maxRequest+1))
	if err != nil {
		return req, err
	}
	if len(data) > maxRequest {
		return req, fmt.Errorf("the request is larger than %d bytes", maxRequest)
	}
	if err := json.Unmarshal(data, &req); err != nil {
		return req, fmt.Errorf("the request is not a components.Request in JSON: %w", err)
	}
	return req, nil
}

// restConfig is the worker's API server: the request's kubeconfig, else the pod's
// service account, else $KUBECONFIG. Nothing else is looked at, as in the agent: a
// binary that quietly picked up someone's ~/.kube/config would install on whatever
// cluster that names.
func restConfig(kubeconfig []byte, getenv func(string) string) (*rest.Config, error) {
	if len(kubeconfig) > 0 {
		cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
		if err != nil {
			// The parser's errors can quote the document, credentials included.
			return nil, errors.New("the request's kubeconfig is not a kubeconfig with a current context")
		}
		return cfg, nil
	}
	cfg, err := workerconfig.InClusterOrEnv(getenv)
	if errors.Is(err, workerconfig.ErrNowhere) {
		return nil, errors.New("the request has no kubeconfig, this is not a pod, and $" + workerconfig.KubeconfigEnv + " is not set")
	}
	return cfg, err
}
