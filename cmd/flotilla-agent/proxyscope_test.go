package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/proxy"
)

// asDispatch is a client of the worker acting as the dispatch identity itself, past the
// agent: what the API server alone lets it do.
func asDispatch(t *testing.T) client.WithWatch {
	t.Helper()
	cfg := rest.CopyConfig(planes[0].Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: dispatchUser}
	return kueueClient(t, cfg)
}

func jobIn(ns, name string, labels map[string]string) *batchv1.Job {
	j := newJob(name)
	j.Namespace, j.Labels = ns, labels
	return j
}

var byHub = map[string]string{kueue.MultiKueueOriginLabel: origin}

// TestTheProxyAndTheAPIServerKeepTheHubInItsWorkloadNamespaces makes the requests of a
// hub that holds the dispatch token, through the agent and straight to the API server
// as the dispatch identity: the agent refuses every one outside the workload namespaces
// and the hub's origin, and the API server refuses those outside the namespaces again.
// What only the agent refuses is said so (RBAC cannot select by label).
func TestTheProxyAndTheAPIServerKeepTheHubInItsWorkloadNamespaces(t *testing.T) {
	ctx := t.Context()
	url, _ := dispatchProxy(t, proxy.Options{})
	for _, ns := range []string{otherNamespace, "kube-system"} {
		ensureNamespace(t, ns)
	}
	viaAgent := kueueClient(t, &rest.Config{Host: url})
	direct := asDispatch(t)

	tests := []struct {
		name string
		job  *batchv1.Job
		// agent: the agent forwards it; apiServer: the API server allows the dispatch
		// identity to do it.
		agent, apiServer bool
	}{
		{name: "a job of the hub in a workload namespace", job: jobIn(dispatchNamespace, "hub-job", byHub), agent: true, apiServer: true},
		{name: "a job in the agent's namespace", job: jobIn(agentNamespace, "as-the-agent", byHub)},
		{name: "a job in kube-system", job: jobIn("kube-system", "as-kube-system", byHub)},
		{name: "a job in a team's own namespace", job: jobIn(otherNamespace, "in-team-own", byHub)},
		{name: "a job without the hub's origin, agent only", job: jobIn(dispatchNamespace, "unlabelled", nil), apiServer: true},
		{name: "a job of another origin, agent only", job: jobIn(dispatchNamespace, "other-origin", map[string]string{kueue.MultiKueueOriginLabel: "elsewhere"}), apiServer: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, side := range []struct {
				who     string
				c       client.Client
				allowed bool
			}{{"the agent", viaAgent, tt.agent}, {"the API server", direct, tt.apiServer}} {
				j := tt.job.DeepCopy()
				err := side.c.Create(ctx, j)
				switch {
				case side.allowed && err != nil:
					t.Errorf("%s refused to create %s/%s: %v", side.who, j.Namespace, j.Name, err)
				case !side.allowed && !apierrors.IsForbidden(err):
					t.Errorf("%s let %s/%s be created: %v, want Forbidden", side.who, j.Namespace, j.Name, err)
				}
				if err == nil {
					if err := planes[0].Client.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}

	t.Run("a watch of every job, agent only", func(t *testing.T) {
		if _, err := viaAgent.Watch(ctx, &batchv1.JobList{}); !apierrors.IsForbidden(err) {
			t.Errorf("the agent forwarded a watch of every job: %v", err)
		}
		w, err := direct.Watch(ctx, &batchv1.JobList{})
		if err != nil {
			t.Fatalf("RBAC refused the dispatch identity a watch of jobs, which MultiKueue needs: %v", err)
		}
		w.Stop()
	})

	t.Run("a team's own job in a workload namespace", func(t *testing.T) {
		own := jobIn(dispatchNamespace, "team-train", nil)
		if err := planes[0].Client.Create(ctx, own); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = planes[0].Client.Delete(context.Background(), own, client.PropagationPolicy(metav1.DeletePropagationBackground))
		})
		if err := viaAgent.Get(ctx, client.ObjectKeyFromObject(own), &batchv1.Job{}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "does not carry the label") {
			t.Errorf("reading a team's job through the agent: %v, want Forbidden", err)
		}
		if err := viaAgent.Delete(ctx, own.DeepCopy(), client.PropagationPolicy(metav1.DeletePropagationBackground)); !apierrors.IsForbidden(err) {
			t.Errorf("deleting a team's job through the agent: %v, want Forbidden", err)
		}
		if err := planes[0].Client.Get(ctx, client.ObjectKeyFromObject(own), &batchv1.Job{}); err != nil {
			t.Errorf("the team's job is gone: %v", err)
		}
	})

	t.Run("an update or patch that takes the hub's label off", func(t *testing.T) {
		wl := newWorkload("keeps-its-label", byHub)
		if err := viaAgent.Create(ctx, wl); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = planes[0].Client.Delete(context.Background(), wl) })
		var got kueue.Workload
		if err := viaAgent.Get(ctx, client.ObjectKeyFromObject(wl), &got); err != nil {
			t.Fatal(err)
		}
		got.Labels = map[string]string{kueue.MultiKueueOriginLabel: "elsewhere"}
		if err := viaAgent.Update(ctx, got.DeepCopy()); !apierrors.IsForbidden(err) {
			t.Errorf("an update that gives the workload another origin: %v, want Forbidden", err)
		}
		patch := []byte(`{"metadata":{"labels":{"` + kueue.MultiKueueOriginLabel + `":null}}}`)
		if err := viaAgent.Patch(ctx, got.DeepCopy(), client.RawPatch("application/merge-patch+json", patch)); !apierrors.IsForbidden(err) {
			t.Errorf("a patch that takes the label off: %v, want Forbidden", err)
		}
	})
}

// replacer sits between the agent and the API server and, once, right after the API
// server answered the agent's read of the live object at path, replaces that object
// with another of the same name that does not carry the hub's label: the write that
// follows concerns an object the agent never checked.
type replacer struct {
	path    string
	replace func()
	once    sync.Once
	fired   chan struct{}
}

func (rp *replacer) serve(t *testing.T) string {
	t.Helper()
	target, err := url.Parse(planes[0].Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(rest.AnonymousClientConfig(planes[0].Config))
	if err != nil {
		t.Fatal(err)
	}
	rp.fired = make(chan struct{})
	upstream := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.Out.Host = target.Host },
		Transport: rt,
		ModifyResponse: func(resp *http.Response) error {
			r := resp.Request
			if r.Method == http.MethodGet && r.URL.Path == rp.path && strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadata") {
				rp.once.Do(func() { rp.replace(); close(rp.fired) })
			}
			return nil
		},
	}
	srv := httptest.NewServer(upstream)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestAWriteGoesOnlyToTheObjectTheProxyChecked replaces the object between the agent's
// check and its write: the write carries the checked object's UID, and the API server
// refuses it.
func TestAWriteGoesOnlyToTheObjectTheProxyChecked(t *testing.T) {
	ctx := t.Context()
	admin := planes[0].Client
	installChartRBAC(t)
	ensureNamespace(t, dispatchNamespace)
	tests := []struct {
		name  string
		write func(c client.Client, wl *kueue.Workload) error
	}{
		{name: "a delete", write: func(c client.Client, wl *kueue.Workload) error { return c.Delete(ctx, wl) }},
		{name: "an update", write: func(c client.Client, wl *kueue.Workload) error {
			wl.Spec.Active = new(bool)
			return c.Update(ctx, wl)
		}},
		{name: "a status apply", write: func(c client.Client, wl *kueue.Workload) error {
			status := &kueue.Workload{
				TypeMeta:   metav1.TypeMeta{APIVersion: kueue.GroupVersion.String(), Kind: "Workload"},
				ObjectMeta: metav1.ObjectMeta{Namespace: wl.Namespace, Name: wl.Name},
				Status: kueue.WorkloadStatus{Conditions: []metav1.Condition{{
					Type: kueue.WorkloadEvicted, Status: metav1.ConditionTrue, Reason: kueue.WorkloadEvictedOnManagerCluster,
					Message: "Evicted on manager: test", LastTransitionTime: metav1.Now(),
				}}},
			}
			//lint:ignore SA1019 the request Kueue v0.17 makes
			return c.Status().Patch(ctx, status, client.Apply, client.FieldOwner("kueue-admission"), client.ForceOwnership)
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "replaced-" + string(rune('a'+i))
			wl := newWorkload(name, byHub)
			if err := admin.Create(ctx, wl); err != nil {
				t.Fatal(err)
			}
			var replacement *kueue.Workload
			rp := &replacer{path: "/apis/kueue.x-k8s.io/v1beta2/namespaces/" + dispatchNamespace + "/workloads/" + name, replace: func() {
				if err := admin.Delete(context.Background(), wl.DeepCopy()); err != nil {
					t.Errorf("deleting the checked workload: %v", err)
				}
				replacement = newWorkload(name, map[string]string{"team": "own"})
				if err := admin.Create(context.Background(), replacement); err != nil {
					t.Errorf("creating its replacement: %v", err)
				}
			}}
			cfg := agentRESTConfig(t)
			cfg.Host, cfg.CAData = rp.serve(t), nil
			p := serveDispatchProxy(t, proxy.Options{Config: cfg})
			p.scope(t, proxy.Scope{Origin: origin, Namespaces: []string{dispatchNamespace}})
			t.Cleanup(func() { _ = admin.Delete(context.Background(), newWorkload(name, nil)) })

			c := kueueClient(t, &rest.Config{Host: p.url})
			var checked kueue.Workload
			if err := admin.Get(ctx, client.ObjectKeyFromObject(wl), &checked); err != nil {
				t.Fatal(err)
			}
			err := tt.write(c, checked.DeepCopy())
			select {
			case <-rp.fired:
			default:
				t.Fatalf("the agent did not read the live workload before writing (%v)", err)
			}
			if err == nil || (!apierrors.IsConflict(err) && !apierrors.IsInvalid(err)) {
				t.Errorf("the write after the replacement: %v, want the API server's refusal for another UID", err)
			}
			var now kueue.Workload
			if err := admin.Get(ctx, client.ObjectKeyFromObject(wl), &now); err != nil {
				t.Fatalf("the replacement is gone: %v", err)
			}
			if now.UID != replacement.UID || now.Labels["team"] != "own" || len(now.Status.Conditions) > 0 || now.Spec.Active != nil && !*now.Spec.Active {
				t.Errorf("the replacement was written: %+v", now.ObjectMeta)
			}
		})
	}
}

// TestObjectsLeftInANamespaceGitDroppedAreOutOfTheHubsReach pins what becomes of the
// hub's jobs in a workload namespace the fleet no longer names: they stay on the worker
// (the agent prunes only its own LocalQueues, never a namespace or a job), and neither
// the agent nor the API server lets the hub read, change or delete them any more.
func TestObjectsLeftInANamespaceGitDroppedAreOutOfTheHubsReach(t *testing.T) {
	ctx := t.Context()
	const dropped = "dispatch-dropped"
	ensureNamespace(t, dropped)
	p := serveDispatchProxy(t, proxy.Options{})
	p.scope(t, proxy.Scope{Origin: origin, Namespaces: []string{dispatchNamespace, dropped}})
	viaAgent := kueueClient(t, &rest.Config{Host: p.url})

	left := jobIn(dropped, "left-behind", byHub)
	if err := viaAgent.Create(ctx, left.DeepCopy()); err != nil {
		t.Fatalf("creating a job in a workload namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = planes[0].Client.Delete(context.Background(), left, client.PropagationPolicy(metav1.DeletePropagationBackground))
	})

	p.scope(t, proxy.Scope{Origin: origin, Namespaces: []string{dispatchNamespace}})
	waitGrant(t, dispatchUser, authorizationv1.ResourceAttributes{Group: "batch", Resource: "jobs", Verb: "get", Namespace: dropped}, false)

	if err := viaAgent.Get(ctx, client.ObjectKeyFromObject(left), &batchv1.Job{}); !apierrors.IsForbidden(err) {
		t.Errorf("reading the job left in %s: %v, want Forbidden", dropped, err)
	}
	if err := viaAgent.Delete(ctx, left.DeepCopy()); !apierrors.IsForbidden(err) {
		t.Errorf("deleting the job left in %s: %v, want Forbidden", dropped, err)
	}
	if err := asDispatch(t).Delete(ctx, left.DeepCopy()); !apierrors.IsForbidden(err) {
		t.Errorf("the API server let the dispatch identity delete the job left in %s: %v", dropped, err)
	}
	if err := planes[0].Client.Get(ctx, client.ObjectKeyFromObject(left), &batchv1.Job{}); err != nil {
		t.Errorf("the job left in %s is gone: %v", dropped, err)
	}
	var ns corev1.Namespace
	if err := planes[0].Client.Get(ctx, client.ObjectKey{Name: dropped}, &ns); err != nil || ns.DeletionTimestamp != nil {
		t.Errorf("the dropped namespace: %v, deleting %v", err, ns.DeletionTimestamp)
	}
}

// TestTheProxyChecksWhatAReadReturns reads through the agent a workload of the hub and a
// team's own, in JSON as Kueue's workload client asks and in protobuf as its job client
// asks: the hub's arrives whole, the team's is refused.
func TestTheProxyChecksWhatAReadReturns(t *testing.T) {
	ctx := t.Context()
	url, _ := dispatchProxy(t, proxy.Options{})
	own := jobIn(dispatchNamespace, "team-read", nil)
	hub := jobIn(dispatchNamespace, "hub-read", byHub)
	for _, j := range []*batchv1.Job{own, hub} {
		if err := planes[0].Client.Create(ctx, j); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = planes[0].Client.Delete(context.Background(), j, client.PropagationPolicy(metav1.DeletePropagationBackground))
		})
	}
	for _, accept := range []string{"application/json", "application/vnd.kubernetes.protobuf,application/json"} {
		for _, j := range []*batchv1.Job{own, hub} {
			req, err := http.NewRequestWithContext(ctx, "GET", url+"/apis/batch/v1/namespaces/"+dispatchNamespace+"/jobs/"+j.Name, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Accept", accept)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if j == own {
				if resp.StatusCode != http.StatusForbidden || bytes.Contains(body, []byte("registry.example")) {
					t.Errorf("a team's job read with Accept %s: HTTP %d %s", accept, resp.StatusCode, body)
				}
				continue
			}
			var got batchv1.Job
			if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil || got.UID != j.UID {
				t.Errorf("the hub's job read with Accept %s: HTTP %d %.200s", accept, resp.StatusCode, body)
			}
		}
	}
}
