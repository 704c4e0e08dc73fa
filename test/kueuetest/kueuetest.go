package kueuetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/logtest"
)

// Namespace is where the manager runs unless Options.Config names another: Kueue's default, and
// where MultiKueue looks for its clusters' kubeconfig Secrets.
const Namespace = configapi.DefaultNamespace

// BinaryEnv names the environment variable that holds the directory of the kueue binary, as
// test/testbin/kueue.sh prints it (`make testbin` exports it).
const BinaryEnv = "FLOTILLA_KUEUE"

const (
	// defaultStartTimeout bounds Start when Options.StartTimeout is zero: generous, because
	// managers and control planes start together on a small machine.
	defaultStartTimeout = 2 * time.Minute
	// stopGrace is how long the manager may take to exit after SIGTERM before it is killed.
	stopGrace = 30 * time.Second
	// cleanupTimeout bounds the removal of the webhooks when the manager stops or dies.
	cleanupTimeout = 30 * time.Second
	// tailSize is how much of the manager's latest output an error carries.
	tailSize = 4 << 10
)

// Options tunes Start. The zero value runs Kueue with its default configuration.
type Options struct {
	// Config is the manager's configuration, e.g. a hub's MultiKueue settings and integrations;
	// nil is Kueue's defaults. Start works on a copy and overwrites the parts it owns (see the
	// package documentation): servers, certificates, leader election.
	Config *configapi.Configuration

	// Output receives the manager's stdout and stderr. Nil discards them; errors from Start and
	// Stop still carry the last few KiB. Several managers may write at once, so it must be safe
	// for concurrent use, as an *os.File is.
	Output io.Writer

	// Log receives the harness's own events (started, webhooks installed, stopped) as key-value
	// records; nil discards them.
	Log *slog.Logger

	// StartTimeout bounds the start, from running the binary to the webhooks being called by
	// the API server; zero means two minutes.
	StartTimeout time.Duration

	// Webhooks says who points the plane's webhook configurations at the manager: Start
	// (WebhooksInstall, the zero value) or the caller (WebhooksExternal).
	Webhooks WebhookMode

	// Args are further command-line arguments, e.g. those of the container a chart's Deployment
	// runs. Start owns --config, --kubeconfig and --visibility-server-port and drops them from
	// Args; a --feature-gates argument takes the place of the configuration's featureGates, which
	// Kueue refuses to read when the flag is set.
	Args []string

	// KubeConfig is what the manager authenticates with, e.g. the token of the ServiceAccount a
	// chart's Deployment names; nil is the plane's admin kubeconfig.
	KubeConfig []byte

	// LeaderElection keeps the configuration's leader election instead of turning it off, with
	// the lease in the manager's namespace (a pod reads that from its service account, a process
	// on this machine must be told). Managers that overlap on one plane, as the old and the new
	// pod of a rolling update do, then take turns as a real Deployment's pods do.
	LeaderElection bool
}

// WebhookMode says who points the plane's webhook configurations at a manager.
type WebhookMode int

const (
	// WebhooksInstall: Start installs Kueue's own webhook configurations, pointed at the
	// manager, and removes them when it stops. A plane holds one such manager at a time.
	WebhooksInstall WebhookMode = iota
	// WebhooksExternal: Start installs none and the caller points existing configurations, for
	// example those a Helm chart installed, at WebhookAddr trusting CABundle. Start returns once
	// the manager reports ready; several managers may run against one plane.
	WebhooksExternal
)

// Manager is one running Kueue manager process against one control plane. Its fields are set by
// Start and must not be changed.
type Manager struct {
	// Plane is the control plane the manager runs against.
	Plane *controlplane.ControlPlane

	// Config is the configuration the manager was started with, the caller's settings with the
	// harness's filled in (before Kueue's own defaulting).
	Config *configapi.Configuration

	// Frameworks are the integrations Kueue enables, after its defaulting, with the ones they
	// imply; their webhooks, with those of Kueue's own kinds, are installed on the plane.
	Frameworks []string

	// HealthAddr and WebhookAddr are the manager's loopback host:port addresses.
	HealthAddr, WebhookAddr string

	// CABundle is the PEM CA certificate that the webhook server's certificate is signed by:
	// the caBundle of every webhook configuration that points at WebhookAddr.
	CABundle []byte

	// StartDuration is how long Start took from running the binary to the manager reporting
	// ready; installing and waiting for the webhooks comes on top.
	StartDuration time.Duration

	dir   string
	cmd   *exec.Cmd
	log   *slog.Logger
	tail  *logtest.Buffer
	hooks *webhooks

	exited   chan struct{} // closed once the process has exited and been reaped
	mu       sync.Mutex
	stopping bool  // Stop has begun: an exit from now on is expected
	early    error // why the process exited before Stop, if it did

	cleanOnce sync.Once
	cleanErr  error
	stopOnce  sync.Once
	stopErr   error
}

// Start runs a Kueue manager against plane and returns once it reports ready and its webhooks are
// installed and called by the API server. ctx bounds the start only: the manager runs until Stop,
// or until the test process ends. A plane holds one manager at a time.
func Start(ctx context.Context, plane *controlplane.ControlPlane, opts Options) (*Manager, error) {
	if plane == nil {
		return nil, errors.New("starting kueue manager: no control plane")
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = defaultStartTimeout
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("plane", plane.Name)
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	for attempt := 1; ; attempt++ {
		m, err := prepare(ctx, plane, opts, log)
		if err != nil {
			return nil, fmt.Errorf("starting kueue manager on %s: %w", plane.Name, err)
		}
		err = m.run(ctx, opts.Output)
		if err == nil {
			return m, nil
		}
		err = errors.Join(err, m.halt())
		// A port that was free when chosen may have been taken since by another process of
		// this machine, which starts servers too: choose again.
		if attempt < portAttempts && m.portTaken() && ctx.Err() == nil {
			log.Warn("a port of the kueue manager was taken before it bound it; retrying with others", "attempt", attempt)
			continue
		}
		return nil, fmt.Errorf("starting kueue manager on %s: %w", plane.Name, err)
	}
}

// portAttempts is how often Start chooses free ports when the manager finds one taken.
const portAttempts = 3

// portTaken reports whether the manager exited because a port it was to listen on was taken.
func (m *Manager) portTaken() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.early != nil && strings.Contains(m.tail.String(), "address already in use")
}

// prepare does everything up to running the process: binary, ports, configuration, certificates,
// webhook configurations, namespace. What it writes goes into a directory of the plane's own.
func prepare(ctx context.Context, plane *controlplane.ControlPlane, opts Options, log *slog.Logger) (*Manager, error) {
	bin, err := binaryPath(ctx)
	if err != nil {
		return nil, err
	}
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(plane.Dir(), "kueue-")
	if err != nil {
		return nil, fmt.Errorf("making the manager's directory: %w", err)
	}
	m := &Manager{Plane: plane, dir: dir, log: log, tail: &logtest.Buffer{Max: tailSize}, exited: make(chan struct{})}
	fail := func(err error) (*Manager, error) { return nil, errors.Join(err, os.RemoveAll(dir)) }

	certDir := filepath.Join(dir, "webhook-certs")
	args, gates, err := managerArgs(opts.Args)
	if err != nil {
		return fail(err)
	}
	m.Config = configure(opts.Config, ports, certDir, settings{leaderElection: opts.LeaderElection, flagGates: gates})
	m.HealthAddr = m.Config.Health.HealthProbeBindAddress
	m.WebhookAddr = net.JoinHostPort(m.Config.Webhook.Host, strconv.Itoa(*m.Config.Webhook.Port))
	m.Frameworks = frameworks(m.Config)

	if opts.Webhooks == WebhooksInstall {
		if m.hooks, err = loadWebhooks(ctx, m.Frameworks); err != nil {
			return fail(err)
		}
		if err := m.hooks.refuseOccupied(ctx, plane); err != nil {
			return fail(err)
		}
	}
	if m.CABundle, err = WriteServingCert(certDir); err != nil {
		return fail(err)
	}
	if m.hooks != nil {
		m.hooks.point(m.Config.Webhook.Host, *m.Config.Webhook.Port, certDir, m.CABundle)
	}
	if err := ensureMetricsCert(); err != nil {
		return fail(err)
	}
	if err := ensureNamespace(ctx, plane, *m.Config.Namespace); err != nil {
		return fail(err)
	}

	configFile, kubeconfig := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "kubeconfig")
	if err := writeConfig(configFile, m.Config); err != nil {
		return fail(err)
	}
	kc := opts.KubeConfig
	if kc == nil {
		kc = plane.KubeConfig
	}
	// A kubeconfig carries a client key or a token: readable by this user only.
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return fail(fmt.Errorf("writing the manager's kubeconfig: %w", err))
	}
	m.cmd = exec.Command(bin, append([]string{"--config=" + configFile, "--kubeconfig=" + kubeconfig}, args...)...)
	m.cmd.Dir = dir
	return m, nil
}

// run starts the process, waits until it reports ready, installs the webhooks and waits until the
// API server calls them.
func (m *Manager) run(ctx context.Context, output io.Writer) error {
	var out io.Writer = m.tail
	if output != nil {
		out = io.MultiWriter(output, m.tail)
	}
	m.cmd.Stdout, m.cmd.Stderr = out, out
	// Kueue's children, if it ever had any, must not keep Wait from returning after it exits.
	m.cmd.WaitDelay = 10 * time.Second
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	began := time.Now()
	started := make(chan error, 1)
	go m.own(started)
	if err := <-started; err != nil {
		return fmt.Errorf("running %s: %w", m.cmd.Path, err)
	}
	m.log.Info("kueue manager started", "pid", m.cmd.Process.Pid, "health", m.HealthAddr, "webhook", m.WebhookAddr)

	if err := m.waitReady(ctx); err != nil {
		return err
	}
	m.StartDuration = time.Since(began)
	m.log.Info("kueue manager ready", "after", m.StartDuration)

	if m.hooks == nil {
		// The caller points the webhook configurations at the manager.
		return nil
	}
	if err := m.hooks.install(ctx, m.Plane); err != nil {
		return err
	}
	if err := waitWebhooks(ctx, m.Plane, true); err != nil {
		return err
	}
	m.log.Info("kueue webhooks installed", "frameworks", m.Frameworks, "after", time.Since(began))
	return nil
}

// own starts the process and waits for it on one goroutine locked to its OS thread: the kernel
// sends the parent-death signal when the thread that forked the process ends, not only when the
// test process does, so that thread must live exactly as long as the manager. The goroutine
// never unlocks, and Go ends the thread only when the goroutine returns, after the process is
// gone.
func (m *Manager) own(started chan<- error) {
	runtime.LockOSThread()
	defer close(m.exited)
	if err := m.cmd.Start(); err != nil {
		started <- err
		return
	}
	started <- nil
	err := m.cmd.Wait()

	m.mu.Lock()
	expected := m.stopping
	if !expected {
		if err == nil {
			err = errors.New("exit status 0")
		}
		m.early = fmt.Errorf("kueue manager exited on its own: %w; last output:\n%s", err, m.tail.String())
	}
	m.mu.Unlock()
	if !expected {
		// Nobody serves the webhooks any more: take them off the plane, which would otherwise
		// refuse every object they cover.
		m.log.Error("kueue manager exited on its own; removing its webhooks", "err", err)
		if cerr := m.removeWebhooks(); cerr != nil {
			m.log.Error("removing the webhooks of an exited kueue manager", "err", cerr)
		}
	}
}

// Done is closed when the manager's process has exited, through Stop or on its own; in the latter
// case only after its webhooks have been taken off the plane.
func (m *Manager) Done() <-chan struct{} { return m.exited }

// Pid is the manager's process id.
func (m *Manager) Pid() int { return m.cmd.Process.Pid }

// ResidentMemory is the manager's resident set size in bytes (VmRSS), as /proc reports it now.
func (m *Manager) ResidentMemory() (int64, error) {
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(m.Pid()), "status"))
	if err != nil {
		return 0, fmt.Errorf("reading resident memory of kueue manager %d: %w", m.Pid(), err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb << 10, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("reading resident memory of kueue manager %d: no VmRSS line", m.Pid())
}

// Stop removes the manager's webhooks from its plane, waits until the API server no longer calls
// them, ends the process (SIGTERM, SIGKILL after 30 s) and removes its files. It returns an error
// also when the process had exited on its own before. It may be called more than once and from
// several goroutines; every call waits for the stop and returns its error.
func (m *Manager) Stop() error {
	if m == nil {
		return nil
	}
	err := m.halt()
	m.mu.Lock()
	early := m.early
	m.mu.Unlock()
	if early != nil {
		return fmt.Errorf("stopping kueue manager on %s: %w", m.Plane.Name, errors.Join(early, err))
	}
	return err
}

// halt is Stop without the report of an earlier exit, which a failed Start has already given.
func (m *Manager) halt() error {
	m.stopOnce.Do(func() { m.stopErr = m.stop() })
	return m.stopErr
}

func (m *Manager) stop() error {
	m.mu.Lock()
	m.stopping = true
	m.mu.Unlock()

	// The webhooks go first, while the manager still answers the calls the API server makes
	// until it has noticed.
	errs := []error{m.removeWebhooks()}
	if m.cmd.Process != nil {
		select {
		case <-m.exited:
		default:
			_ = m.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-m.exited:
			case <-time.After(stopGrace):
				_ = m.cmd.Process.Kill()
				<-m.exited
				errs = append(errs, fmt.Errorf("kueue manager did not exit within %v of SIGTERM and was killed", stopGrace))
			}
		}
	}
	errs = append(errs, os.RemoveAll(m.dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stopping kueue manager on %s: %w", m.Plane.Name, err)
	}
	m.log.Info("kueue manager stopped")
	return nil
}

// removeWebhooks takes the manager's webhook configurations off the plane, once, and waits until
// the API server no longer calls them.
func (m *Manager) removeWebhooks() error {
	m.cleanOnce.Do(func() {
		if m.hooks == nil || !m.hooks.installed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		m.cleanErr = m.hooks.uninstall(ctx, m.Plane)
		if m.cleanErr == nil {
			m.cleanErr = waitWebhooks(ctx, m.Plane, false)
		}
	})
	return m.cleanErr
}

// waitReady polls the manager's readiness endpoint, which Kueue reports once its webhook server
// listens, until it answers 200, the process exits or ctx ends.
func (m *Manager) waitReady(ctx context.Context) error {
	gone := func() error {
		select {
		case <-m.exited:
			m.mu.Lock()
			defer m.mu.Unlock()
			return cmp.Or(m.early, errExited)
		default:
			return nil
		}
	}
	err := controlplane.PollReady(ctx, &http.Client{Timeout: 2 * time.Second}, "http://"+m.HealthAddr+"/readyz", gone)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w; last output:\n%s", err, m.tail.String())
	}
	return err
}

// errExited ends the wait for readiness when the process has exited and said nothing of why.
var errExited = errors.New("kueue manager exited")

// ensureNamespace creates the manager's namespace on the plane unless it exists.
func ensureNamespace(ctx context.Context, plane *controlplane.ControlPlane, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := plane.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// binaryPath finds the kueue binary: in the directory BinaryEnv names (a path to the binary
// itself is accepted too), else in the one test/testbin/kueue.sh prints.
func binaryPath(ctx context.Context) (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	dir, err := controlplane.BinaryDir(ctx, BinaryEnv, "kueue.sh", "kueue")
	if err != nil {
		return "", fmt.Errorf("finding the kueue binary: %w", err)
	}
	return filepath.Join(dir, "kueue"), nil
}

// FreePorts returns n distinct ports on 127.0.0.1 that were free a moment ago. All listeners are
// held until every port is chosen, so that the n are distinct.
func FreePorts(n int) ([]int, error) {
	var (
		ports     []int
		listeners []net.Listener
	)
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("choosing a free loopback port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
