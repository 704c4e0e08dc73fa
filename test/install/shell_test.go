package install

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// commandTimeout bounds one command of the README: generous, for a loaded machine (the
// path takes about a minute on two cores), and shorter than the README's own waits, which
// return as soon as they can: a hub that cannot start (a permission missing from its chart)
// fails the test in minutes.
const commandTimeout = 4 * time.Minute

// shell is one bash session that runs the README's commands one at a time, as a user types
// them: the working directory and the variables carry over from one command to the next.
// Its transcript (each command, then what it printed) is a file, written by bash directly,
// so that a command's output is all there once bash reports its status.
type shell struct {
	t          *testing.T
	stdin      io.WriteCloser
	status     *bufio.Reader
	transcript string
}

// startShell starts bash in dir with exactly env.
func startShell(t *testing.T, dir string, env []string, transcript string) *shell {
	t.Helper()
	out, err := os.OpenFile(transcript, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = out, out
	// fd 3: where the session reports each command's exit status.
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Forked from a thread locked for the session's lifetime: the parent-death signal
	// follows the forking thread, and Go ends a thread when a goroutine that locked it
	// returns (see test/podrunner).
	started, exited := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(exited)
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	s := &shell{t: t, stdin: stdin, status: bufio.NewReader(r), transcript: transcript}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		_ = r.Close()
	})
	return s
}

// run runs one command and returns what it printed, or fails the test with it when the
// command fails or outlasts commandTimeout.
func (s *shell) run(command string) string {
	s.t.Helper()
	before := s.size()
	if err := s.appendTranscript("$ " + command + "\n"); err != nil {
		s.t.Fatal(err)
	}
	// Braces run the command in the session itself (a cd or a variable carries over), with
	// stdin from /dev/null, so that a command that reads stdin cannot swallow the next one.
	if _, err := fmt.Fprintf(s.stdin, "{\n%s\n} </dev/null\nprintf '%%s\\n' \"$?\" >&3\n", command); err != nil {
		s.t.Fatalf("%s: the session ended: %v", command, err)
	}
	type result struct {
		line string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		line, err := s.status.ReadString('\n')
		done <- result{line, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(commandTimeout):
		s.t.Fatalf("%s: still running after %s; it printed:\n%s", command, commandTimeout, s.since(before))
	}
	printed := s.since(before)
	if res.err != nil {
		s.t.Fatalf("%s: the session ended: %v; it printed:\n%s", command, res.err, printed)
	}
	code, err := strconv.Atoi(strings.TrimSpace(res.line))
	if err != nil || code != 0 {
		s.t.Fatalf("%s: exit status %s; it printed:\n%s", command, strings.TrimSpace(res.line), printed)
	}
	// Without the command line itself.
	_, output, _ := strings.Cut(printed, "\n")
	return output
}

func (s *shell) appendTranscript(text string) error {
	f, err := os.OpenFile(s.transcript, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}

func (s *shell) size() int64 {
	info, err := os.Stat(s.transcript)
	if err != nil {
		return 0
	}
	return info.Size()
}

// since is the transcript from offset on.
func (s *shell) since(offset int64) string {
	data, err := os.ReadFile(s.transcript)
	if err != nil || int64(len(data)) < offset {
		return ""
	}
	return string(data[offset:])
}
