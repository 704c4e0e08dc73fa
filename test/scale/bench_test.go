package scale

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// benchSizes are the fleets BenchmarkHub measures, smallest first:
// FLOTILLA_SCALE_SIZES=1,1000,10000 by default.
func benchSizes(b *testing.B) []int {
	spec := os.Getenv("FLOTILLA_SCALE_SIZES")
	if spec == "" {
		return []int{1, 1000, 10000}
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("FLOTILLA_SCALE_SIZES: %q is not a fleet size", f)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// benchProfile is the realistic hub, with the client's rate limit of
// FLOTILLA_SCALE_QPS (burst twice that) and status.lastSeen recorded every
// FLOTILLA_SCALE_LASTSEEN (a duration) when set: what other settings would give.
func benchProfile(b *testing.B) hubProfile {
	p := realistic
	if v := os.Getenv("FLOTILLA_SCALE_QPS"); v != "" {
		qps, err := strconv.Atoi(v)
		if err != nil || qps < 1 {
			b.Fatalf("FLOTILLA_SCALE_QPS: %q is not a rate", v)
		}
		p.QPS, p.Burst = float32(qps), max(200, 2*qps)
	}
	if v := os.Getenv("FLOTILLA_SCALE_LASTSEEN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("FLOTILLA_SCALE_LASTSEEN: %q is not a duration", v)
		}
		p.LastSeenEvery = d
	}
	return p
}

// pushSamples is how many one-cluster changes each push-to-success iteration times.
const pushSamples = 10

// idleWindow is how long an idle iteration watches the hub: longer than the tunnel's
// default status.lastSeen interval.
const idleWindow = 90 * time.Second

// BenchmarkHub measures the hub in fleets of 1, 1,000 and 10,000 clusters, one after
// the other in one process, each set up once (at ten thousand clusters that takes
// minutes) with the hub as cmd/flotilla-hub runs it by default: its client limited to
// 100 requests a second in bursts of 200 and 64 under way at once, as a service
// account that the API server's priority and fairness may queue or refuse. Success is what a cluster's commit status
// calls it without dispatch: configured at the new generation.
//
//   - push-to-success: a commit cordons or uncordons one cluster; from the webhook to
//     its status success on the forge, for pushSamples commits per iteration, with the
//     share of the hub's fetch (s-fetch) and of the git server's answers to it
//     (s-server) in that.
//   - fleet-wide (1,000 clusters and more): a commit to fleet.yaml changes every
//     cluster; until the fleet's summary on the forge says every cluster is ready (every
//     agent acknowledged its new state), with the forge's requests, and until every
//     WorkerCluster's status in the hub cluster says so as well.
//   - cold-start (10,000 clusters): a new hub, nothing in memory, all agents redialling
//     with a real agent's backoff; until every agent is back and every cluster ready,
//     with the hub cluster's requests.
//   - fleet-wide and cold-start also report the cores each process used meanwhile
//     (cores-apiserver, cores-etcd, cores-agents, and cores-test: the hub with the
//     forge and git server), which on two cores tells what a figure waited for.
//   - idle (1,000 clusters and more): what the connected agents' heartbeats cost the
//     hub cluster afterwards, in requests a second.
//   - memory (1,000 clusters and more): the hub's memory per cluster with every agent
//     connected and idle, measured as what stopping it gives back (it ends the world,
//     so -benchtime 1x).
//
// Run it with
//
//	go test -run '^$' -bench Hub -benchtime 1x -timeout 3h ./test/scale/
func BenchmarkHub(b *testing.B) {
	profile := benchProfile(b)
	pushes := map[int]time.Duration{}
	for _, n := range benchSizes(b) {
		w := newWorld(b, n, profile)
		b.Run(fmt.Sprintf("clusters=%d/push-to-success", n), func(b *testing.B) {
			var took []time.Duration
			var fetched, served time.Duration
			var slowest pushTimes
			before := w.hub.requests.snapshot()
			for b.Loop() {
				for range pushSamples {
					p := w.pushOne(b, len(took))
					took, fetched, served = append(took, p.took), fetched+p.fetch, served+p.server
					if p.took > slowest.took {
						slowest = p
					}
				}
			}
			got := w.hub.requests.snapshot().minus(before)
			slices.Sort(took)
			// An outlier is told apart: its fetch, or what the hub did after it.
			b.Logf("the slowest push at %d clusters: %s, of which the fetch %s (git's server %s)", n,
				slowest.took.Round(time.Microsecond), slowest.fetch.Round(time.Microsecond), slowest.server.Round(time.Microsecond))
			var total time.Duration
			for _, d := range took {
				total += d
			}
			mean := total / time.Duration(len(took))
			pushes[n] = mean
			b.ReportMetric(mean.Seconds(), "s/push")
			b.ReportMetric(took[len(took)/2].Seconds(), "s-p50")
			b.ReportMetric(took[len(took)-1].Seconds(), "s-max")
			b.ReportMetric(float64(got.writes())/float64(len(took)), "writes/push")
			b.ReportMetric(float64(got.reads())/float64(len(took)), "reads/push")
			// Of which fetching the commit and telling what it changed.
			b.ReportMetric(fetched.Seconds()/float64(len(took)), "s-fetch/push")
			// Of which the git server's answers to the fetch, which grow with the fleet
			// for git's own client too (gitsource's BenchmarkFetchOneChange).
			b.ReportMetric(served.Seconds()/float64(len(took)), "s-server/push")
			if one, ok := pushes[1]; ok && n > 1 {
				b.ReportMetric(mean.Seconds()/one.Seconds(), "x-1-cluster")
			}
		})
		if n >= 1000 {
			b.Run(fmt.Sprintf("clusters=%d/fleet-wide", n), func(b *testing.B) {
				var summarized, recorded time.Duration
				var forgeRequests int
				before, cpu := w.hub.requests.snapshot(), readCPU(b)
				for b.Loop() {
					s, r, f := w.changeAll(b)
					summarized, recorded, forgeRequests = summarized+s, recorded+r, forgeRequests+f
				}
				readCPU(b).minus(cpu).report(b, recorded)
				got := w.hub.requests.snapshot().minus(before)
				waves := float64(b.N)
				b.ReportMetric(summarized.Seconds()/waves, "s-summary")
				b.ReportMetric(recorded.Seconds()/waves, "s-recorded")
				b.ReportMetric(float64(forgeRequests)/waves, "forge-requests")
				b.ReportMetric(float64(got.writes())/waves/float64(n), "writes/cluster")
				b.ReportMetric(float64(got.reads())/waves/float64(n), "reads/cluster")
				b.ReportMetric(float64(got.refused), "refused")
				b.Logf("a fleet-wide change at %d clusters: %s", n, got)
			})
		}
		if n >= 10000 {
			b.Run(fmt.Sprintf("clusters=%d/cold-start", n), func(b *testing.B) {
				var steady time.Duration
				var got requests
				var decrypted int64
				cpu := readCPU(b)
				for b.Loop() {
					after := w.restartHub(profile)
					w.waitSteady(after, 30*time.Minute)
					w.hub.waitSync(b, 0)
					steady += time.Since(w.hub.started)
					r := w.hub.requests.snapshot()
					got.by, got.refused = sum(got.by, r.by), got.refused+r.refused
					decrypted += w.hub.dec.Decryptions()
				}
				readCPU(b).minus(cpu).report(b, steady)
				starts := float64(b.N)
				b.ReportMetric(steady.Seconds()/starts, "s-steady")
				b.ReportMetric(float64(got.total())/starts/float64(n), "requests/cluster")
				b.ReportMetric(float64(got.writes())/starts/float64(n), "writes/cluster")
				b.ReportMetric(float64(got.reads())/starts/float64(n), "reads/cluster")
				b.ReportMetric(float64(decrypted)/starts/float64(n), "decryptions/cluster")
				b.ReportMetric(float64(got.refused), "refused")
				b.Logf("a cold start at %d clusters: %s", n, got)
			})
		}
		if n >= 1000 {
			b.Run(fmt.Sprintf("clusters=%d/idle", n), func(b *testing.B) {
				// What connected, idle agents cost the hub cluster: each agent's heartbeat
				// every 10 seconds, status.lastSeen recorded about once a minute (less often past
				// 600 agents: ten a second in all).
				before, began := w.hub.requests.snapshot(), time.Now()
				for b.Loop() {
					time.Sleep(idleWindow)
				}
				got := w.hub.requests.snapshot().minus(before)
				took := time.Since(began).Seconds()
				b.ReportMetric(float64(got.writes())/took, "writes/s")
				b.ReportMetric(float64(got.reads())/took, "reads/s")
				b.ReportMetric(float64(got.refused), "refused")
			})
		}
		if n >= 1000 {
			b.Run(fmt.Sprintf("clusters=%d/memory", n), func(b *testing.B) {
				// The hub's share of the process, all included (its cache, tunnels,
				// rendered states, the fleet's copy): what it holds with every agent
				// connected and idle, less what the process holds once it stopped.
				var with, without uint64
				for b.Loop() {
					with = inUse()
					w.close()
					without = inUse()
				}
				b.ReportMetric(float64(with-min(with, without))/float64(n), "B/cluster")
			})
		}
		w.close()
	}
}

// inUse is the memory the process's heap and stacks hold after a collection.
func inUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

func sum(a, b map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range a {
		out[k] += v
	}
	for k, v := range b {
		out[k] += v
	}
	return out
}

// pushTimes are the parts of one push's time to success.
type pushTimes struct {
	// took is from the webhook to the cluster's status success on the commit.
	took time.Duration
	// fetch is what the hub's syncs spent fetching meanwhile, and server what git's
	// server spent answering them.
	fetch, server time.Duration
}

// pushOne cordons or uncordons one cluster, the i-th change, and times the hub's way to
// the cluster's status success on the commit.
func (w *world) pushOne(b *testing.B, i int) pushTimes {
	name := fleetgen.ClusterName(i * 7919 % w.n)
	file := fleet.ClustersDir + "/" + name + "/" + fleet.ClusterFile
	before := w.file(file)
	after := strings.Replace(before, "cordoned: false", "cordoned: true", 1)
	if after == before {
		after = strings.Replace(before, "cordoned: true", "cordoned: false", 1)
	}
	sha := w.push("toggle the cordon of "+name, map[string][]byte{file: []byte(after)})
	// The push fetched too, through the test's own clone; from here on only the hub does.
	served, fetched := w.git.FetchTime(), w.hub.fetchTime()
	began := time.Now()
	w.hub.src.Trigger()
	w.waitForge(b, sha, "flotilla/"+name, "success", 5*time.Minute)
	return pushTimes{took: time.Since(began), fetch: w.hub.fetchTime() - fetched, server: w.git.FetchTime() - served}
}

// changeAll changes every cluster's desired state with one commit to fleet.yaml (a
// workload namespace added or removed), and returns how long until the fleet's summary
// on the commit said every cluster is ready, how long until every WorkerCluster's
// status showed its agent's acknowledgement of its new state, and how many requests
// the forge served until both. The hub posts what its agents acknowledged as they
// do; its writes to the hub cluster follow at the pace of its request budget.
func (w *world) changeAll(b *testing.B) (summarized, recorded time.Duration, forgeRequests int) {
	desired := map[string]string{}
	for name, wc := range w.watch.snapshot() {
		desired[name] = wc.Status.DesiredHash
	}
	spec := w.file(fleet.FleetFile)
	next := strings.Replace(spec, "    - ml-training\n", "    - ml-training\n    - ml-serving\n", 1)
	if next == spec {
		next = strings.Replace(spec, "    - ml-serving\n", "", 1)
	}
	forgeBefore := len(w.forge.Store.Requests())
	sha := w.push("a workload namespace more or less on every cluster", map[string][]byte{fleet.FleetFile: []byte(next)})
	began := time.Now()
	w.hub.src.Trigger()
	// The summary is watched beside the records, every 5 milliseconds: the wave's
	// figure is seconds, and the forge's store is not to be kept busy meanwhile.
	type shown struct {
		after time.Duration
		err   error
	}
	summary := make(chan shown, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		err := w.forgeShows(sha, "flotilla/fleet", "success", 10*time.Minute, 5*time.Millisecond, stop)
		summary <- shown{time.Since(began), err}
	}()
	w.watch.waitAll(b, "every cluster configured at its new desired state", time.Hour, func(wc *v1alpha1.WorkerCluster) bool {
		return ready(wc) && wc.Status.DesiredHash != desired[wc.Name]
	})
	recorded = time.Since(began)
	got := <-summary
	if got.err != nil {
		b.Fatal(got.err)
	}
	summarized = got.after
	made := w.forge.Store.Requests()[forgeBefore:]
	kinds := map[string]int{}
	for _, r := range made {
		on := "another commit"
		if strings.Contains(r.Path, sha) {
			on = "the commit"
		}
		kinds[r.Method+" on "+on]++
	}
	b.Logf("the forge's requests for a fleet-wide commit: %v", kinds)
	return summarized, recorded, len(made)
}

// waitForge waits until the forge shows state for context on commit, looking every
// millisecond: what is measured is the hub's latency, not the test's patience.
func (w *world) waitForge(b *testing.B, commit, context, state string, within time.Duration) {
	b.Helper()
	if err := w.forgeShows(commit, context, state, within, time.Millisecond, nil); err != nil {
		b.Fatal(err)
	}
}

// forgeShows is waitForge for any goroutine, looking every interval until stop is
// closed: it returns why it gave up.
func (w *world) forgeShows(commit, context, state string, within, every time.Duration, stop <-chan struct{}) error {
	deadline := time.Now().Add(within)
	last := "no status"
	for time.Now().Before(deadline) {
		for _, r := range w.forge.Store.Latest(commit) {
			if r.Context == context {
				if r.State == state {
					return nil
				}
				last = r.State + ": " + r.Description
			}
		}
		select {
		case <-stop:
			return fmt.Errorf("%s %s on %.8s: stopped looking; last: %s", context, state, commit, last)
		case <-time.After(every):
		}
	}
	return fmt.Errorf("%s %s on %.8s: not within %s; last: %s", context, state, commit, within, last)
}
