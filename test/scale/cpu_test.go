package scale

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, 100 on every
// architecture Linux runs Go on.
const userHZ = 100

// cpuUse is the CPU time spent so far by this process ("test": the hub, the forge and
// the git server) and by the processes it started, by command name ("kube-apiserver",
// "etcd"; "agents" for the re-executed test binary that simulates them). On a machine
// of two cores, it tells which of them a figure waited for.
type cpuUse map[string]time.Duration

// readCPU reads cpuUse from /proc; nil where there is no /proc.
func readCPU(tb testing.TB) cpuUse {
	tb.Helper()
	self := os.Getpid()
	type proc struct {
		comm string
		ppid int
		cpu  time.Duration
	}
	procs := map[int]proc{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // it ended meanwhile
		}
		// pid (comm) state ppid ... utime stime: comm may hold spaces and parentheses.
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(s[:open]))
		if err != nil {
			continue
		}
		rest := strings.Fields(s[end+1:])
		if len(rest) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(rest[1])
		utime, _ := strconv.ParseInt(rest[11], 10, 64)
		stime, _ := strconv.ParseInt(rest[12], 10, 64)
		procs[pid] = proc{comm: s[open+1 : end], ppid: ppid, cpu: time.Duration(utime+stime) * time.Second / userHZ}
	}
	if _, ok := procs[self]; !ok {
		return nil
	}
	descends := func(pid int) bool {
		for range 64 {
			p, ok := procs[pid]
			if !ok || p.ppid <= 1 {
				return false
			}
			if p.ppid == self {
				return true
			}
			pid = p.ppid
		}
		return false
	}
	use := cpuUse{"test": procs[self].cpu}
	for pid, p := range procs {
		if pid == self || !descends(pid) {
			continue
		}
		name := p.comm
		if name == procs[self].comm {
			name = "agents"
		}
		use[name] += p.cpu
	}
	return use
}

// minus is what was spent since before, of the processes alive at both readings.
func (u cpuUse) minus(before cpuUse) cpuUse {
	out := cpuUse{}
	for name, d := range u {
		if b, ok := before[name]; ok && d >= b {
			out[name] = d - b
		}
	}
	return out
}

// report gives each process's share of elapsed as cores-<name> (kube-apiserver as
// cores-apiserver), the ones that matter on a shared machine.
func (u cpuUse) report(b *testing.B, elapsed time.Duration) {
	if elapsed <= 0 {
		return
	}
	var all []string
	for name, d := range u {
		if d == 0 {
			continue
		}
		short := strings.TrimPrefix(name, "kube-")
		if strings.ContainsAny(short, " \t") {
			continue
		}
		b.ReportMetric(d.Seconds()/elapsed.Seconds(), "cores-"+short)
		all = append(all, fmt.Sprintf("%s %.2f", short, d.Seconds()/elapsed.Seconds()))
	}
	slices.Sort(all)
	b.Logf("cores used over %s: %s", elapsed.Round(time.Millisecond), strings.Join(all, ", "))
}
