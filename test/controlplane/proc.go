package controlplane

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// killChildren sends SIGKILL to this process's children whose command line mentions dir. It
// lets Start give up on a plane while envtest is still waiting for it: envtest waits for its
// processes without a context, so killing them is what makes it return promptly. The parent
// check and the plane's unique directory make sure nothing else is hit.
func killChildren(dir string) {
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); !ok || ppid != self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		// Every path of the plane is inside dir; the separator keeps a sibling whose name
		// merely starts with dir's from matching.
		if err != nil || !bytes.Contains(cmdline, []byte(dir+string(filepath.Separator))) {
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// parentOf reads the parent pid from /proc/PID/stat.
func parentOf(pid int) (int, bool) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	// The command name in parentheses may itself hold spaces or parentheses.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}
