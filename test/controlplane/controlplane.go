// Package controlplane starts real Kubernetes control planes (kube-apiserver and etcd through
// controller-runtime's envtest) for integration tests, several at once, each with its own etcd,
// with Kueue's, JobSet's and flotilla's CRDs installed.
//
// A test package starts its planes once, from TestMain:
//
//	var planes []*controlplane.ControlPlane
//
//	func TestMain(m *testing.M) {
//		controlplane.Main(m, 2, &planes, controlplane.Options{})
//	}
//
// Nothing a plane starts outlives the test process: each binary runs under setpriv so that the
// kernel kills it when the test process dies, and Main removes all temporary directories also
// when a test panics, the process is interrupted or -test.timeout approaches.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	jobsetv1alpha2 "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueuev1beta2 "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	flotillav1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// defaultStartTimeout is how long each of etcd and kube-apiserver may take to become healthy, and
// the CRDs to become established, when Options.StartTimeout is zero. It is generous because the
// planes of a package start together on a small machine, possibly next to a build.
const defaultStartTimeout = 90 * time.Second

// Options tunes Start. The zero value is what most tests want.
type Options struct {
	// CRDDirs are further directories or files of CRD manifests to install on every plane, after
	// Kueue's, JobSet's and flotilla's own. Each must exist.
	CRDDirs []string

	// WithoutComponentCRDs leaves out Kueue's and JobSet's CRDs: a worker where they are yet
	// to be installed, as the agent installs them with their Helm charts.
	WithoutComponentCRDs bool

	// WithoutFlotillaCRDs leaves out flotilla's own CRDs: a hub cluster where the hub's
	// chart is yet to install them.
	WithoutFlotillaCRDs bool

	// TempDir is where each plane makes its temporary directory (certificates, etcd data,
	// wrappers). Main points it at its per-process root so that everything is removed at once;
	// empty means os.TempDir().
	TempDir string

	// StartTimeout bounds the start of each binary and the establishment of the CRDs; zero means
	// 90 seconds, enough for several planes starting together on two cores.
	StartTimeout time.Duration

	// Output receives the stdout and stderr of the binaries, e.g. os.Stderr while debugging a
	// plane that does not start. All planes write to it at once, so it must be safe for
	// concurrent use, as an *os.File is. Nil discards them, unless
	// KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT is true: then envtest sends them to the test's
	// own stdout and stderr.
	Output io.Writer
}

// ControlPlane is one running kube-apiserver with its own etcd. Its fields are set by Start and
// must not be changed.
type ControlPlane struct {
	// Name tells the planes of one Start apart in messages: plane-0, plane-1, ...
	Name string

	// Config authenticates as an admin (system:masters). Copy it before changing it.
	Config *rest.Config

	// KubeConfig is Config as a kubeconfig file, e.g. for a MultiKueue cluster secret. The server
	// address is on the loopback interface.
	KubeConfig []byte

	// Client is an admin client whose scheme (Client.Scheme()) knows the core Kubernetes types,
	// apiextensions/v1, Kueue's kueue.x-k8s.io/v1beta2, JobSet's jobset.x-k8s.io/v1alpha2 and
	// flotilla's flotilla.dev/v1alpha1.
	Client client.Client

	dir      string
	stop     chan struct{} // closed by Stop: the owner goroutine stops the plane
	done     chan struct{} // closed by the owner once the plane is stopped and dir removed
	stopOnce sync.Once
	err      error // why the plane failed to start or stop; written before done is closed
}

// Start starts n independent control planes concurrently, each with its own etcd, and returns
// once every one serves its CRDs and reports ready. If any fails, or ctx ends first, the ones
// already started are stopped and an error is returned. The caller stops the planes with
// StopAll; Main does all of that for a test package.
func Start(ctx context.Context, n int, opts Options) ([]*ControlPlane, error) {
	if n < 1 {
		return nil, fmt.Errorf("starting control planes: n is %d, want at least 1", n)
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = defaultStartTimeout
	}
	root, err := repoRoot()
	if err != nil {
		return nil, fmt.Errorf("starting control planes: %w", err)
	}
	assets, err := binaryDir(ctx, root)
	if err != nil {
		return nil, fmt.Errorf("starting control planes: %w", err)
	}
	crds, err := crdPaths(ctx, root, !opts.WithoutComponentCRDs, !opts.WithoutFlotillaCRDs, opts.CRDDirs)
	if err != nil {
		return nil, fmt.Errorf("starting control planes: %w", err)
	}
	scheme, err := newScheme()
	if err != nil {
		return nil, fmt.Errorf("starting control planes: %w", err)
	}

	planes := make([]*ControlPlane, n)
	g, gctx := errgroup.WithContext(ctx)
	for i := range planes {
		g.Go(func() error {
			p, err := startPlane(gctx, fmt.Sprintf("plane-%d", i), assets, crds, scheme, opts)
			planes[i] = p
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, errors.Join(err, StopAll(planes))
	}
	return planes, nil
}

// Dir is the plane's own temporary directory. Processes that run against the plane (a Kueue
// manager, say) keep their files in it: it is removed when the plane stops, and by Main's reaper
// when the test process dies without stopping the plane.
func (p *ControlPlane) Dir() string { return p.dir }

// StopAll stops the given planes concurrently and returns all of their errors. Nil entries are
// skipped, so it can be handed a partly filled slice.
func StopAll(planes []*ControlPlane) error {
	errs := make([]error, len(planes))
	var wg sync.WaitGroup
	for i, p := range planes {
		wg.Go(func() { errs[i] = p.Stop() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Stop stops the plane's processes and removes its temporary directory. It may be called more
// than once and from several goroutines; every call waits for the stop and returns its error.
func (p *ControlPlane) Stop() error {
	if p == nil {
		return nil
	}
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
	return p.err
}

func newScheme() (*kruntime.Scheme, error) {
	s := kruntime.NewScheme()
	for _, add := range []func(*kruntime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		kueuev1beta2.AddToScheme,
		jobsetv1alpha2.AddToScheme,
		flotillav1alpha1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("building scheme: %w", err)
		}
	}
	return s, nil
}

// startPlane starts one plane in its own temporary directory under opts.TempDir.
func startPlane(ctx context.Context, name, assets string, crds []string, scheme *kruntime.Scheme, opts Options) (*ControlPlane, error) {
	dir, err := os.MkdirTemp(opts.TempDir, name+"-")
	if err != nil {
		return nil, fmt.Errorf("starting control plane %s: %w", name, err)
	}
	apiserverPath, etcdPath, err := writeWrappers(filepath.Join(dir, "bin"), assets)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("starting control plane %s: %w", name, err), os.RemoveAll(dir))
	}
	env := &envtest.Environment{
		ControlPlane: envtest.ControlPlane{
			APIServer: &envtest.APIServer{
				Path:    apiserverPath,
				CertDir: filepath.Join(dir, "apiserver"),
				Out:     opts.Output,
				Err:     opts.Output,
			},
			Etcd: &envtest.Etcd{
				Path:    etcdPath,
				DataDir: filepath.Join(dir, "etcd"),
				Out:     opts.Output,
				Err:     opts.Output,
			},
		},
		BinaryAssetsDirectory: assets,
		Scheme:                scheme,
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths:              crds,
			ErrorIfPathMissing: true,
			MaxTime:            opts.StartTimeout,
		},
		ErrorIfCRDPathMissing:    true,
		UseExistingCluster:       new(false),
		ControlPlaneStartTimeout: opts.StartTimeout,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	for _, d := range []string{env.ControlPlane.APIServer.CertDir, env.ControlPlane.Etcd.DataDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, errors.Join(fmt.Errorf("starting control plane %s: %w", name, err), os.RemoveAll(dir))
		}
	}

	p := &ControlPlane{Name: name, dir: dir, stop: make(chan struct{}), done: make(chan struct{})}
	started := make(chan error, 1)
	go p.own(env, started)

	select {
	case err = <-started:
	case <-ctx.Done():
		err = abandon(dir, started, ctx.Err())
	}
	if err == nil {
		p.Config, p.KubeConfig = env.Config, env.KubeConfig
		if p.Client, err = client.New(env.Config, client.Options{Scheme: scheme}); err == nil {
			err = waitReady(ctx, env.Config, opts.StartTimeout)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("starting control plane %s: %w", name, errors.Join(err, p.Stop()))
	}
	return p, nil
}

// abandon makes a plane's envtest start return early: envtest takes no context and retries a
// failed start several times, so its processes are killed until it gives up.
func abandon(dir string, started <-chan error, cause error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		killChildren(dir)
		select {
		case err := <-started:
			return errors.Join(cause, err)
		case <-tick.C:
		}
	}
}

// own runs the plane's whole life on one goroutine locked to its OS thread. The kernel sends the
// parent-death signal when the thread that forked a binary exits, not only when the process
// does, so the forking thread must live exactly as long as the plane: the goroutine never
// unlocks, and Go ends the thread only when the goroutine returns, after the binaries are gone.
func (p *ControlPlane) own(env *envtest.Environment, started chan<- error) {
	runtime.LockOSThread()
	defer close(p.done)

	if _, err := env.Start(); err != nil {
		// envtest leaves the binaries running when a later step, e.g. installing CRDs, fails.
		p.err = errors.Join(env.Stop(), os.RemoveAll(p.dir))
		started <- err
		return
	}
	// envtest always makes a directory of webhook serving certificates in os.TempDir(), outside
	// the plane's directory. No webhook is served here, so it goes now rather than at Stop,
	// which a killed test process never reaches.
	if err := env.WebhookInstallOptions.Cleanup(); err != nil {
		p.err = errors.Join(err, env.Stop(), os.RemoveAll(p.dir))
		started <- err
		return
	}
	env.WebhookInstallOptions.LocalServingCertDir = ""
	started <- nil
	<-p.stop
	if err := errors.Join(env.Stop(), os.RemoveAll(p.dir)); err != nil {
		p.err = fmt.Errorf("stopping control plane %s: %w", p.Name, err)
	}
}

// waitReady polls /readyz until the apiserver reports all its post-start hooks done.
func waitReady(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("waiting for /readyz: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return PollReady(ctx, hc, strings.TrimSuffix(cfg.Host, "/")+"/readyz", nil)
}

// PollReady polls url until it answers 200 OK, ctx ends, or gone (when not nil) returns
// an error, which it returns as is: a process behind url that exited. A wait that ends
// otherwise says what the last answer was.
func PollReady(ctx context.Context, hc *http.Client, url string, gone func() error) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if gone != nil {
			if err := gone(); err != nil {
				return false, err
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			last = err
			return false, nil
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
			return false, nil
		}
		return true, nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("waiting for %s: %w (last answer: %v)", url, err, last)
	}
	return err
}
