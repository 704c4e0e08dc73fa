package podrunner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// proc is one run of a container's process.
type proc struct {
	cmd  *exec.Cmd
	out  *prefixWriter
	done chan struct{}
	err  error // why it exited; set before done is closed
}

// startProcess runs spec's binary in dir, its output to out. The process leads a process
// group of its own, so that stopping it stops what it started (the agent's installer), and
// gets SIGKILL when the test process dies.
func startProcess(spec *containerSpec, dir string, out *prefixWriter) (*proc, error) {
	cmd := exec.Command(spec.binary, spec.args...)
	cmd.Dir = dir
	cmd.Env = spec.env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A child left holding the output must not keep Wait from returning.
	cmd.WaitDelay = 10 * time.Second
	p := &proc{cmd: cmd, out: out, done: make(chan struct{})}
	started := make(chan error, 1)
	// The kernel sends the parent-death signal when the thread that forked the process
	// ends, not only when the test process does, and Go ends a thread when a goroutine that
	// locked it returns (test/kueuetest's managers do). So the process is forked from a
	// thread locked for exactly its lifetime: never unlocked, it ends once the process is
	// gone, and no other goroutine can lock it and end it earlier.
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		out.flush()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("running %s: %w", spec.binary, err)
	}
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop sends the process group SIGTERM and, if it has not exited after grace, SIGKILL,
// as the kubelet stops a container; it returns once the process has exited.
func (p *proc) stop(grace time.Duration) error {
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("killed after the grace period of %s", grace)
	}
	// The group may hold children that outlive their parent's graceful exit.
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	var exit *exec.ExitError
	if p.err != nil && !errors.As(p.err, &exit) {
		return p.err
	}
	return nil
}

// probe runs a readiness probe against the Pod's process: an HTTP GET answered with a status
// below 400, or a TCP connection accepted. A container without a readiness probe is ready
// once it runs, as in Kubernetes.
func probe(ctx context.Context, pr *corev1.Probe, p *pod) bool {
	if pr == nil {
		return true
	}
	timeout := time.Second
	if pr.TimeoutSeconds > 0 {
		timeout = time.Duration(pr.TimeoutSeconds) * time.Second
	}
	switch {
	case pr.HTTPGet != nil:
		addr, ok := p.addrOf(pr.HTTPGet.Port.IntVal, pr.HTTPGet.Port.StrVal)
		if !ok {
			return false
		}
		scheme := strings.ToLower(string(pr.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+pr.HTTPGet.Path, nil)
		if err != nil {
			return false
		}
		for _, h := range pr.HTTPGet.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		resp, err := p.r.probes.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 400
	case pr.TCPSocket != nil:
		addr, ok := p.addrOf(pr.TCPSocket.Port.IntVal, pr.TCPSocket.Port.StrVal)
		if !ok {
			return false
		}
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}
	// exec and gRPC probes cannot be played.
	return false
}

// newProbeClient probes as the kubelet does: no connection kept between probes, and an
// HTTPS probe's certificate is not verified.
func newProbeClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // as the kubelet probes
}
