package controlplane

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Main is the whole TestMain of a package that needs control planes, so that they start once
// per package rather than once per test:
//
//	func TestMain(m *testing.M) { controlplane.Main(m, 2, &planes, controlplane.Options{}) }
//
// It makes one temporary root for the process (under opts.TempDir, else os.TempDir()), starts n
// planes in it, stores them in *planes, runs the tests, stops the planes, removes the root and
// exits with the tests' code. It never returns.
//
// Everything is also cleaned up when the tests do not get that far:
//   - SIGINT or SIGTERM stops the planes, removes the root and exits 1;
//   - a watchdog does the same a margin before -test.timeout would make the test binary panic
//     (whose deferred functions would never run), after printing all goroutines so that the
//     hung test can be found;
//   - if the process dies anyway (a panicking test, SIGKILL), the binaries get SIGKILL from the
//     kernel, and a small reaper process, which notices the death as EOF on a pipe, removes the
//     root.
func Main(m *testing.M, n int, planes *[]*ControlPlane, opts Options) {
	os.Exit(run(m, n, planes, opts))
}

func run(m *testing.M, n int, planes *[]*ControlPlane, opts Options) int {
	began := time.Now()
	if !flag.Parsed() {
		flag.Parse()
	}

	root, err := os.MkdirTemp(opts.TempDir, "flotilla-controlplane-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: making temporary root: %v\n", err)
		return 1
	}
	reap, err := startReaper(root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		_ = os.RemoveAll(root)
		return 1
	}
	opts.TempDir = root

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The planes are published for the abort path only once Start has returned, so that it
	// never races Start over them; startDone tells it when that is.
	var (
		mu        sync.Mutex
		started   []*ControlPlane
		startDone = make(chan struct{})
		cleanOnce sync.Once
		cleanErr  error
	)
	cleanup := func() error {
		cleanOnce.Do(func() {
			cancel()
			select {
			case <-startDone:
			case <-time.After(time.Minute):
				cleanErr = errors.New("control planes were still starting a minute after they were cancelled")
			}
			mu.Lock()
			ps := started
			mu.Unlock()
			cleanErr = errors.Join(cleanErr, StopAll(ps), os.RemoveAll(root), reap())
		})
		return cleanErr
	}

	finished := make(chan struct{})
	defer close(finished)
	go guard(finished, testTimeout(), began, func(reason string, dump bool) {
		fmt.Fprintf(os.Stderr, "controlplane: %s: stopping control planes and exiting\n", reason)
		if dump {
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		}
		if err := cleanup(); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane: cleaning up: %v\n", err)
		}
		os.Exit(1)
	})

	ps, err := Start(ctx, n, opts)
	mu.Lock()
	started = ps
	mu.Unlock()
	close(startDone)
	if err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		if err := cleanup(); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane: cleaning up: %v\n", err)
		}
		return 1
	}
	*planes = ps

	code := m.Run()
	if err := cleanup(); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: cleaning up: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// guard calls abort on SIGINT or SIGTERM, and when the watchdog deadline derived from the test
// timeout passes, unless finished is closed first.
func guard(finished <-chan struct{}, timeout time.Duration, began time.Time, abort func(reason string, dump bool)) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(time.Until(began.Add(timeout - watchdogMargin(timeout))))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-finished:
	case sig := <-sigs:
		// A second Ctrl-C now kills the process at once; the kernel and the reaper still
		// clean up after it.
		signal.Stop(sigs)
		abort(fmt.Sprintf("received %v", sig), false)
	case <-expired:
		abort(fmt.Sprintf("the tests would reach -test.timeout=%v within %v", timeout, watchdogMargin(timeout)), true)
	}
}

// testTimeout is the value of -test.timeout, or zero when there is none.
func testTimeout() time.Duration {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return 0
	}
	if g, ok := f.Value.(flag.Getter); ok {
		if d, ok := g.Get().(time.Duration); ok {
			return d
		}
	}
	return 0
}

// watchdogMargin is how long before -test.timeout the watchdog fires: long enough to stop the
// planes and clean up before the testing package panics, 20s or 5% of the timeout, at most 2
// minutes and at most a quarter of the timeout.
func watchdogMargin(timeout time.Duration) time.Duration {
	return min(max(20*time.Second, timeout/20), 2*time.Minute, timeout/4)
}

// reaperScript waits for EOF on its stdin, which comes when the test process closes the pipe or
// dies, then removes the root. By then the kernel has killed the control-plane binaries, which
// might still have been writing into the root for a moment, hence the retries.
const reaperScript = `cat >/dev/null
i=0
while [ -e "$1" ] && [ "$i" -lt 50 ]; do
	rm -rf -- "$1" 2>/dev/null || sleep 0.1
	i=$((i+1))
done
`

// startReaper starts the process that removes root if this process dies without doing it. It
// runs in its own process group, so that a Ctrl-C aimed at the test does not kill it first. The
// returned function ends it after the root is removed.
func startReaper(root string) (func() error, error) {
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "reaper", root)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("starting reaper: %w", err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting reaper: %w", err)
	}
	return func() error {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("reaper: %w", err)
			}
			return nil
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			return errors.Join(errors.New("reaper did not exit"), <-done)
		}
	}, nil
}
