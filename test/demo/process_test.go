//go:build demo

package demo

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// stopGrace is how long a process may take to shut down after SIGTERM before it is
// killed: the hub and the agents close their tunnels and flush their logs in well under
// a second.
const stopGrace = 15 * time.Second

// process is one of the demo's long-running binaries, its output in a log file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // why it exited; set before done is closed
}

// start runs path with args, stdout and stderr appended to logFile, until stop. The
// process gets its own process group, so that the terminal's Ctrl-C reaches only the
// demo, which then stops everything in order; and SIGKILL when the demo dies, so that
// nothing outlives it. Go never ends the OS thread that forked a child (the parent-death
// signal follows the thread) unless a goroutine locked to it returns, which none here do.
func start(name, logFile, path string, args ...string) (*process, error) {
	f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, log: logFile, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited is why the process ended, or nil while it runs.
func (p *process) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited", p.name)
		}
		return fmt.Errorf("%s exited: %w", p.name, p.err)
	default:
		return nil
	}
}

// stop asks the process to shut down and kills it if it does not in time.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail is the last n lines of a log file, for a diagnosis.
func tail(file string, n int) []string {
	f, err := os.Open(file)
	if err != nil {
		return []string{fmt.Sprintf("(cannot read %s: %v)", file, err)}
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines
}

// freeAddr is a loopback address with a port free at the time of the call, for a
// process that takes its listen address as a flag.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// reaperScript removes the demo's directory once its stdin reaches EOF: when the demo
// closes the pipe, or dies without cleaning up (a second Ctrl-C, SIGKILL). The children
// are being killed at that moment and may still write for an instant, hence the retries.
const reaperScript = `cat >/dev/null
i=0
while [ -e "$1" ] && [ "$i" -lt 50 ]; do
	rm -rf -- "$1" 2>/dev/null || sleep 0.1
	i=$((i+1))
done
`

// startReaper starts the process that removes dir if the demo cannot, in a process
// group of its own so that Ctrl-C does not end it first. The returned function removes
// dir and ends the reaper.
func startReaper(dir string) (func() error, error) {
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "flotilla-demo-reaper", dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("starting the reaper of %s: %w", dir, err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the reaper of %s: %w", dir, err)
	}
	return func() error {
		err := os.RemoveAll(dir)
		_ = stdin.Close()
		return errors.Join(err, cmd.Wait())
	}, nil
}

// shellQuote quotes an argument for display only when a shell would need it.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"$`\\*?[]{}()<>|&;#~!") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
