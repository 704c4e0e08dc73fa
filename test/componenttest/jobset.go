package componenttest

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
	"sync"
	"syscall"
	"time"

	configv1alpha1 "k8s.io/component-base/config/v1alpha1"
	"k8s.io/utils/ptr"
	jobsetconfig "sigs.k8s.io/jobset/api/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
	"github.com/flotilla-gitops/flotilla/test/logtest"
)

// JobSetBinaryEnv names the environment variable that holds the directory of the jobset
// binary, as test/testbin/jobset.sh prints it (`make testbin` exports it).
const JobSetBinaryEnv = "FLOTILLA_JOBSET"

const (
	// loopback is where every server of a manager listens: test traffic stays on this machine.
	loopback = "127.0.0.1"
	// stopGrace is how long a manager may take to exit after SIGTERM before it is killed.
	stopGrace = 30 * time.Second
	// tailSize is how much of a manager's latest output an error carries.
	tailSize = 4 << 10
)

// jobSetOwnedFlags are JobSet's flags that name files or bind ports: the harness sets them.
var jobSetOwnedFlags = []string{"config", "kubeconfig", "metrics-bind-address", "health-probe-bind-address"}

// jobSetProcess is one JobSet manager process.
type jobSetProcess struct {
	cmd    *exec.Cmd
	dir    string
	tail   *logtest.Buffer
	log    *slog.Logger
	exited chan struct{}

	mu       sync.Mutex
	stopping bool
	early    error // why the process exited before Stop, if it did

	stopOnce sync.Once
	stopErr  error
}

// startJobSet runs JobSet's manager with the chart's configuration and arguments, servers on
// free loopback ports and a serving certificate from the harness, and returns once it reports
// ready.
func startJobSet(ctx context.Context, spec *podSpec, p startParams) (*instance, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	fail := func(err error) (*instance, error) {
		return nil, fmt.Errorf("starting jobset manager on %s: %w", p.plane.Name, err)
	}
	bin, err := jobSetBinary(ctx)
	if err != nil {
		return fail(err)
	}
	cfg := &jobsetconfig.Configuration{}
	if spec.config != nil {
		if err := decodeConfig(spec.config, jobsetconfig.GroupVersion.String(), cfg); err != nil {
			return fail(fmt.Errorf("jobset's configuration %s: %w", spec.configPath, err))
		}
	}
	ports, err := kueuetest.FreePorts(3)
	if err != nil {
		return fail(err)
	}
	dir, err := os.MkdirTemp(p.plane.Dir(), "jobset-")
	if err != nil {
		return fail(fmt.Errorf("making the manager's directory: %w", err))
	}
	proc := &jobSetProcess{dir: dir, tail: &logtest.Buffer{Max: tailSize}, log: p.log, exited: make(chan struct{})}
	certDir := filepath.Join(dir, "certs")
	ca, err := kueuetest.WriteServingCert(certDir)
	if err != nil {
		return fail(errors.Join(err, os.RemoveAll(dir)))
	}
	configureJobSet(cfg, ports, certDir, spec.namespace)
	configFile, kubeconfig := filepath.Join(dir, "config.yaml"), filepath.Join(dir, "kubeconfig")
	data, err := yaml.Marshal(cfg)
	if err == nil {
		err = os.WriteFile(configFile, data, 0o600)
	}
	if err == nil {
		// The kubeconfig carries a token: readable by this user only.
		err = os.WriteFile(kubeconfig, p.kubeconfig, 0o600)
	}
	if err != nil {
		return fail(errors.Join(fmt.Errorf("writing the manager's files: %w", err), os.RemoveAll(dir)))
	}
	args := append([]string{"--config=" + configFile, "--kubeconfig=" + kubeconfig}, trimArgs(spec.args, jobSetOwnedFlags...)...)
	proc.cmd = exec.Command(bin, args...)
	proc.cmd.Dir = dir
	var out io.Writer = proc.tail
	if p.output != nil {
		out = io.MultiWriter(p.output, proc.tail)
	}
	proc.cmd.Stdout, proc.cmd.Stderr = out, out
	proc.cmd.WaitDelay = 10 * time.Second
	proc.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	started := make(chan error, 1)
	go proc.own(started)
	if err := <-started; err != nil {
		return fail(errors.Join(fmt.Errorf("running %s: %w", bin, err), os.RemoveAll(dir)))
	}
	health := cfg.Health.HealthProbeBindAddress
	p.log.Info("jobset manager started", "pid", proc.cmd.Process.Pid, "health", health)
	gone := func() error {
		select {
		case <-proc.exited:
			proc.mu.Lock()
			defer proc.mu.Unlock()
			return cmp.Or(proc.early, errors.New("jobset manager exited"))
		default:
			return nil
		}
	}
	if err := controlplane.PollReady(ctx, &http.Client{Timeout: 2 * time.Second}, "http://"+health+"/readyz", gone); err != nil {
		return fail(errors.Join(fmt.Errorf("%w; last output:\n%s", err, proc.tail.String()), proc.halt()))
	}
	addr := net.JoinHostPort(cfg.Webhook.Host, strconv.Itoa(*cfg.Webhook.Port))
	return &instance{spec: spec, pid: proc.cmd.Process.Pid, addr: addr, ca: ca, started: time.Now(), done: proc.exited, stop: proc.Stop}, nil
}

// configureJobSet overrides what a process on this machine must change in the chart's
// configuration: servers on the given loopback ports, the harness's certificate for the webhook
// and metrics servers, no internal certificate management, and the lease's namespace.
func configureJobSet(cfg *jobsetconfig.Configuration, ports []int, certDir, namespace string) {
	addr := func(port int) string { return net.JoinHostPort(loopback, strconv.Itoa(port)) }
	cfg.APIVersion, cfg.Kind = jobsetconfig.GroupVersion.String(), "Configuration"
	cfg.Health.HealthProbeBindAddress = addr(ports[0])
	cfg.Metrics = jobsetconfig.ControllerMetrics{BindAddress: addr(ports[1]), CertDir: certDir}
	cfg.Webhook = jobsetconfig.ControllerWebhook{Host: loopback, Port: ptr.To(ports[2]), CertDir: certDir}
	// The certificate comes from the harness, whose CA the webhook configurations get; JobSet's
	// own rotation would write a Secret and patch configurations that name a Service.
	cfg.InternalCertManagement = &jobsetconfig.InternalCertManagement{Enable: ptr.To(false)}
	if cfg.LeaderElection == nil {
		cfg.LeaderElection = &configv1alpha1.LeaderElectionConfiguration{}
	}
	if ptr.Deref(cfg.LeaderElection.LeaderElect, false) && cfg.LeaderElection.ResourceNamespace == "" {
		// In a pod, controller-runtime reads the lease's namespace from the service account's
		// files; a process here has none.
		cfg.LeaderElection.ResourceNamespace = namespace
	}
}

// own starts the process and waits for it on one goroutine locked to its OS thread: the kernel
// sends the parent-death signal when the thread that forked the process ends, so that thread
// must live exactly as long as the manager (see test/kueuetest).
func (p *jobSetProcess) own(started chan<- error) {
	runtime.LockOSThread()
	defer close(p.exited)
	if err := p.cmd.Start(); err != nil {
		started <- err
		return
	}
	started <- nil
	err := p.cmd.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopping {
		if err == nil {
			err = errors.New("exit status 0")
		}
		p.early = fmt.Errorf("jobset manager exited on its own: %w; last output:\n%s", err, p.tail.String())
		p.log.Error("jobset manager exited on its own", "err", err)
	}
}

// Stop ends the process (SIGTERM, SIGKILL after a grace period) and removes its files. It
// reports an earlier exit of the process on its own too. It may be called more than once.
func (p *jobSetProcess) Stop() error {
	err := p.halt()
	p.mu.Lock()
	early := p.early
	p.mu.Unlock()
	if early != nil {
		return errors.Join(early, err)
	}
	return err
}

func (p *jobSetProcess) halt() error {
	p.stopOnce.Do(func() {
		p.mu.Lock()
		p.stopping = true
		p.mu.Unlock()
		var errs []error
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(stopGrace):
				_ = p.cmd.Process.Kill()
				<-p.exited
				errs = append(errs, fmt.Errorf("jobset manager did not exit within %v of SIGTERM and was killed", stopGrace))
			}
		}
		errs = append(errs, os.RemoveAll(p.dir))
		if err := errors.Join(errs...); err != nil {
			p.stopErr = fmt.Errorf("stopping jobset manager %d: %w", p.cmd.Process.Pid, err)
			return
		}
		p.log.Info("jobset manager stopped", "pid", p.cmd.Process.Pid)
	})
	return p.stopErr
}

// jobSetBinary finds the jobset binary: in the directory JobSetBinaryEnv names, else in the one
// test/testbin/jobset.sh prints (building it on first use).
func jobSetBinary(ctx context.Context) (string, error) {
	dir, err := controlplane.BinaryDir(ctx, JobSetBinaryEnv, "jobset.sh", "jobset")
	if err != nil {
		return "", fmt.Errorf("finding the jobset binary: %w", err)
	}
	return filepath.Join(dir, "jobset"), nil
}
