package controlplane_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobsetv1alpha2 "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueuev1beta2 "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// childEnv switches the test binary into the helper mode of TestPdeathsig: one plane, and
// TestPdeathsigChild reports its processes and waits to be killed.
const childEnv = "FLOTILLA_CONTROLPLANE_PDEATHSIG_CHILD"

var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	n := 2
	if os.Getenv(childEnv) != "" {
		n = 1
	}
	controlplane.Main(m, n, &planes, controlplane.Options{})
}

func skipInChild(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("helper process of TestPdeathsig")
	}
}

func TestPlanesAreIndependent(t *testing.T) {
	skipInChild(t)
	ctx := t.Context()
	a, b := planes[0], planes[1]
	if a.Config.Host == b.Config.Host {
		t.Fatalf("both planes serve on %s", a.Config.Host)
	}

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "only-on-" + a.Name}}
	if err := a.Client.Create(ctx, ns); err != nil {
		t.Fatalf("creating namespace on %s: %v", a.Name, err)
	}
	t.Cleanup(func() { _ = a.Client.Delete(context.Background(), ns) })

	if err := a.Client.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{}); err != nil {
		t.Fatalf("namespace on %s: %v", a.Name, err)
	}
	err := b.Client.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("namespace %s on %s: got %v, want NotFound", ns.Name, b.Name, err)
	}
}

func TestCRDsAreServed(t *testing.T) {
	skipInChild(t)
	ctx := t.Context()
	kinds := []schema.GroupVersionKind{
		kueuev1beta2.GroupVersion.WithKind("ClusterQueue"),
		kueuev1beta2.GroupVersion.WithKind("LocalQueue"),
		kueuev1beta2.GroupVersion.WithKind("ResourceFlavor"),
		kueuev1beta2.GroupVersion.WithKind("AdmissionCheck"),
		kueuev1beta2.GroupVersion.WithKind("ProvisioningRequestConfig"),
		kueuev1beta2.GroupVersion.WithKind("MultiKueueCluster"),
		kueuev1beta2.GroupVersion.WithKind("MultiKueueConfig"),
		kueuev1beta2.GroupVersion.WithKind("Workload"),
		jobsetv1alpha2.GroupVersion.WithKind("JobSet"),
	}
	for _, p := range planes {
		for _, gvk := range kinds {
			m, err := p.Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Errorf("%s does not serve %s: %v", p.Name, gvk, err)
				continue
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			name := m.Resource.Resource + "." + gvk.Group
			if err := p.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
				t.Errorf("%s: CRD %s: %v", p.Name, name, err)
				continue
			}
			if !established(crd) {
				t.Errorf("%s: CRD %s is not established: %+v", p.Name, name, crd.Status.Conditions)
			}
		}
	}

	// flotilla's own CRDs, once generated, are installed too.
	own := flotillaCRDNames(t)
	t.Logf("checking %d flotilla CRDs: %v", len(own), own)
	for _, name := range own {
		for _, p := range planes {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := p.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
				t.Errorf("%s: flotilla CRD %s: %v", p.Name, name, err)
			} else if !established(crd) {
				t.Errorf("%s: flotilla CRD %s is not established", p.Name, name)
			}
		}
	}

	c := planes[0].Client
	flavor := &kueuev1beta2.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: "default-flavor"}}
	if err := c.Create(ctx, flavor); err != nil {
		t.Fatalf("creating ResourceFlavor: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), flavor) })

	cq := &kueuev1beta2.ClusterQueue{
		ObjectMeta: metav1.ObjectMeta{Name: "cluster-queue"},
		Spec: kueuev1beta2.ClusterQueueSpec{
			NamespaceSelector: &metav1.LabelSelector{},
			ResourceGroups: []kueuev1beta2.ResourceGroup{{
				CoveredResources: []corev1.ResourceName{corev1.ResourceCPU},
				Flavors: []kueuev1beta2.FlavorQuotas{{
					Name: kueuev1beta2.ResourceFlavorReference(flavor.Name),
					Resources: []kueuev1beta2.ResourceQuota{{
						Name:         corev1.ResourceCPU,
						NominalQuota: resource.MustParse("4"),
					}},
				}},
			}},
		},
	}
	if err := c.Create(ctx, cq); err != nil {
		t.Fatalf("creating ClusterQueue: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), cq) })

	got := &kueuev1beta2.ClusterQueue{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cq), got); err != nil {
		t.Fatalf("reading ClusterQueue back: %v", err)
	}
	q := got.Spec.ResourceGroups[0].Flavors[0].Resources[0].NominalQuota
	if q.Cmp(resource.MustParse("4")) != 0 {
		t.Errorf("ClusterQueue nominal quota: got %s, want 4", q.String())
	}
	if err := planes[1].Client.Get(ctx, client.ObjectKeyFromObject(cq), &kueuev1beta2.ClusterQueue{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterQueue on %s: got %v, want NotFound", planes[1].Name, err)
	}
}

// flotillaCRDNames reads the names of the CRDs in the repository's charts/flotilla-hub/crds.
func flotillaCRDNames(t *testing.T) []string {
	t.Helper()
	dir := filepath.Join("..", "..", "charts", "flotilla-hub", "crds")
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	} else if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
		for {
			var crd apiextensionsv1.CustomResourceDefinition
			if err := dec.Decode(&crd); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("reading %s: %v", e.Name(), err)
			}
			if crd.Name != "" {
				names = append(names, crd.Name)
			}
		}
		_ = f.Close()
	}
	return names
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// proc is a process as /proc shows it; start (clock ticks since boot) tells a process from a
// later one that reuses its pid.
type proc struct {
	pid   int
	comm  string
	state string
	ppid  int
	start string
}

func readProc(pid int) (proc, bool) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return proc{}, false
	}
	open, closing := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || closing < open {
		return proc{}, false
	}
	f := strings.Fields(string(stat[closing+1:]))
	if len(f) < 20 {
		return proc{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	// Fields after the name: state(0) ppid(1) ... starttime(19).
	return proc{pid: pid, comm: string(stat[open+1 : closing]), state: f[0], ppid: ppid, start: f[19]}, true
}

// TestPdeathsigChild is the helper process of TestPdeathsig: it prints its control plane's
// processes and waits to be killed.
func TestPdeathsigChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs only as the helper process of TestPdeathsig")
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var line []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok && p.ppid == os.Getpid() && (p.comm == "kube-apiserver" || p.comm == "etcd") {
			line = append(line, fmt.Sprintf("%s=%d", p.comm, p.pid))
		}
	}
	fmt.Printf("PIDS %s\n", strings.Join(line, " "))
	// The parent kills this process; the deadline only bounds a broken parent.
	select {
	case <-t.Context().Done():
	case <-time.After(2 * time.Minute):
		t.Fatal("was not killed")
	}
}

// TestPdeathsig runs this test binary as a helper process that starts one control plane, kills
// it with SIGKILL, so that no deferred function or cleanup runs, and checks that the plane's
// kube-apiserver and etcd die with it and that its temporary directories are removed.
func TestPdeathsig(t *testing.T) {
	skipInChild(t)
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPdeathsigChild$", "-test.v", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), childEnv+"=1", "TMPDIR="+tmp)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting helper process: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	pidsLine := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "PIDS "); ok {
				pidsLine <- rest
				break
			}
		}
		close(pidsLine)
		_, _ = bufio.NewReader(stdout).WriteTo(os.Stdout)
	}()
	var line string
	select {
	case l, ok := <-pidsLine:
		if !ok {
			t.Fatal("helper process ended without reporting its processes")
		}
		line = l
	case <-ctx.Done():
		t.Fatal("helper process did not report its processes in time")
	}

	var procs []proc
	comms := map[string]bool{}
	for _, f := range strings.Fields(line) {
		comm, pidText, _ := strings.Cut(f, "=")
		pid, err := strconv.Atoi(pidText)
		if err != nil {
			t.Fatalf("bad PIDS line %q", line)
		}
		p, ok := readProc(pid)
		if !ok || p.comm != comm {
			t.Fatalf("process %s=%d is not running before the kill", comm, pid)
		}
		procs = append(procs, p)
		comms[comm] = true
	}
	if !comms["kube-apiserver"] || !comms["etcd"] {
		t.Fatalf("helper process reported %q, want a kube-apiserver and an etcd", line)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// The kernel kills the binaries as the helper dies; the reaper then removes its files.
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, p := range procs {
			if alive(p) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, p := range procs {
			if alive(p) {
				t.Errorf("%s (pid %d) outlived the test process", p.comm, p.pid)
			}
		}
		t.Fatal(err)
	}
	var left []os.DirEntry
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		left, err = os.ReadDir(tmp)
		return err == nil && len(left) == 0, err
	})
	if err != nil {
		t.Fatalf("temporary files outlived the test process: %v: %v", left, err)
	}
}

// alive reports whether p still runs: a zombie has died, and a process with another start time
// is a later one that reuses the pid.
func alive(p proc) bool {
	now, ok := readProc(p.pid)
	return ok && now.start == p.start && now.state != "Z"
}
