//go:build demo

package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// row is what the table shows of one cluster: its conditions on the hub, its GPUs, and
// the commit status the hub recorded, as git notes, on the commit its state came from.
type row struct {
	name                                                     string
	registered, connected, configured, ready, dispatch, gpus string
	commit                                                   string
	status                                                   commitstatus.Status
	conditions                                               []metav1.Condition
}

// green is what the demo waits for: the cluster is registered, connected, configured
// at the desired state, ready, and the hub's Kueue dispatches to it, and its commit
// says so.
func (r row) green() bool {
	return r.registered == "True" && r.connected == "True" && r.configured == "True" && r.ready == "True" &&
		r.dispatch == "True" && r.status.State == commitstatus.Success
}

func (r row) cells() []string {
	st := "-"
	if r.status.State != "" {
		st = string(r.status.State) + ": " + r.status.Description
	}
	return []string{r.name, r.registered, r.connected, r.configured, r.ready, r.dispatch, r.gpus, short(r.commit), st}
}

var header = []string{"CLUSTER", "REGISTERED", "CONNECTED", "CONFIGURED", "READY", "DISPATCHREADY", "GPUS", "COMMIT", "STATUS"}

// rows reads every worker's row from the hub cluster and the fleet repository's notes.
func (d *demo) rows(ctx context.Context) ([]row, error) {
	var list v1alpha1.WorkerClusterList
	if err := d.hubPlane.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing WorkerClusters in %s on the hub: %w", namespace, err)
	}
	byName := map[string]*v1alpha1.WorkerCluster{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	rows := make([]row, 0, len(d.workers))
	for _, w := range d.workers {
		r := row{name: w.name, registered: "-", connected: "-", configured: "-", ready: "-", dispatch: "-", gpus: "-", commit: w.commit}
		if wc := byName[w.name]; wc != nil {
			r.registered = condition(wc, v1alpha1.ConditionRegistered)
			r.connected = condition(wc, v1alpha1.ConditionConnected)
			r.configured = condition(wc, v1alpha1.ConditionWorkerConfigured)
			r.ready = condition(wc, v1alpha1.ConditionReady)
			r.dispatch = condition(wc, v1alpha1.ConditionDispatchReady)
			r.gpus = gpus(wc.Status.GPUs)
			r.conditions = wc.Status.Conditions
			// The hub records where the cluster's state came from: its status is there.
			if c := wc.SourceCommit(); c != "" {
				r.commit = c
			}
		}
		if r.commit != "" {
			statuses, err := d.notes.Latest(ctx, r.commit)
			if err != nil {
				return nil, fmt.Errorf("reading the statuses of %s: %w", short(r.commit), err)
			}
			r.status = statuses[contextPrefix+w.name]
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// condition is True, False or Unknown, as kubectl shows a condition; Unknown until set.
func condition(wc *v1alpha1.WorkerCluster, typ string) string {
	if c := meta.FindStatusCondition(wc.Status.Conditions, typ); c != nil && c.Status != "" {
		return string(c.Status)
	}
	return string(metav1.ConditionUnknown)
}

// gpus is "16× NVIDIA-H100-80GB-HBM3", as `flotilla cluster list` prints the totals.
func gpus(totals []v1alpha1.GPUTotal) string {
	if len(totals) == 0 {
		return "<none>"
	}
	parts := make([]string, len(totals))
	for i, g := range totals {
		parts[i] = fmt.Sprintf("%d× %s", g.Count, g.Product)
	}
	return strings.Join(parts, ", ")
}

func short(sha string) string {
	if len(sha) > 8 {
		return sha[:8]
	}
	if sha == "" {
		return "-"
	}
	return sha
}

// table prints rows as they change: on a terminal one table redrawn in place, else a
// line per change of a cluster's row, which reads well in a CI log.
type table struct {
	out   io.Writer
	tty   bool
	width func() int // the terminal's columns; lines are cut to fit so the redraw stays aligned
	began time.Time

	drawn int               // lines drawn last time, on a terminal
	last  map[string]string // each cluster's last line, elsewhere
}

// show draws rows, with note (an error of the last read, say) under them on a terminal.
func (t *table) show(rows []row, note string) {
	if !t.tty {
		if t.last == nil {
			t.last = map[string]string{}
		}
		for _, r := range rows {
			c := r.cells()
			line := fmt.Sprintf("%s  registered=%s connected=%s configured=%s ready=%s dispatchReady=%s gpus=%s  %s%s@%s %s",
				c[0], c[1], c[2], c[3], c[4], c[5], c[6], contextPrefix, r.name, c[7], c[8])
			if t.last[r.name] != line {
				t.last[r.name] = line
				fmt.Fprintf(t.out, "    [%6.1fs] %s\n", time.Since(t.began).Seconds(), line)
			}
		}
		if note != "" && t.last[""] != note {
			t.last[""] = note
			fmt.Fprintf(t.out, "    [%6.1fs] %s\n", time.Since(t.began).Seconds(), note)
		}
		return
	}
	lines := format(rows)
	footer := fmt.Sprintf("  %s · refreshed every second · Ctrl-C stops the demo", time.Since(t.began).Round(time.Second))
	if note != "" {
		footer += " · " + note
	}
	lines = append(lines, footer)
	var b strings.Builder
	if t.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", t.drawn) // back to the table's first line
	}
	width := t.width()
	for _, l := range lines {
		b.WriteString("\r\x1b[2K" + cut(l, width-1) + "\n")
	}
	t.drawn = len(lines)
	_, _ = io.WriteString(t.out, b.String())
}

// format lays rows out under the header, indented.
func format(rows []row) []string {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  "+strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, "  "+strings.Join(r.cells(), "\t"))
	}
	_ = tw.Flush()
	return strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
}

// cut shortens s to n runes, marking the cut; every character the table prints is one
// column wide.
func cut(s string, n int) string {
	if n <= 0 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
