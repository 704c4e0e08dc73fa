package proxy

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

const (
	wl  = "/apis/kueue.x-k8s.io/v1beta2"
	job = "/apis/batch/v1"
	js  = "/apis/jobset.x-k8s.io/v1alpha2"

	// byOrigin is the selector MultiKueue lists and watches by, for the origin "hub".
	byOrigin = "labelSelector=kueue.x-k8s.io%2Fmultikueue-origin%3Dhub"
)

// agentNamespace is the namespace of the agent the tests' handlers serve in.
const agentNamespace = "flotilla-system"

// scoped is a handler of the agent in agentNamespace, scoped as s says, that reaches no
// API server: what it forwards is read from check.
func scoped(t *testing.T, integrations []Integration, s Scope) *Handler {
	t.Helper()
	h, err := New(Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}, Namespace: agentNamespace, Integrations: integrations})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.SetScope(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	return h
}

// fleetScope is what a hub of origin "hub" sends for a fleet of workload namespaces
// team-a and team-b, with the namespaces no hub may reach besides.
var fleetScope = Scope{Origin: "hub", Namespaces: []string{"team-a", "team-b", agentNamespace, "kube-system", "kueue-system", "jobset-system"}}

// TestRequestsAreForwardedOnlyIfMultiKueueMakesThem reads requests as the proxy does and
// checks which it forwards: what it forwards is said as the API server's authorizer
// would (verb and resource), what it refuses with the reason the caller is told.
func TestRequestsAreForwardedOnlyIfMultiKueueMakesThem(t *testing.T) {
	h := scoped(t, DefaultIntegrations(), fleetScope)
	tests := []struct {
		name    string
		method  string
		target  string
		header  http.Header
		forward string // "verb resource[.group]" or "discovery"; empty when refused
		refuse  string // part of the reason
	}{
		// Discovery, for the RESTMapper of Kueue's worker client.
		{name: "the core API versions", method: "GET", target: "/api", forward: "discovery"},
		{name: "the core group's resources", method: "GET", target: "/api/v1", forward: "discovery"},
		{name: "the API groups", method: "GET", target: "/apis", forward: "discovery"},
		{name: "a group", method: "GET", target: "/apis/kueue.x-k8s.io", forward: "discovery"},
		{name: "a group version's resources, of any group", method: "GET", target: "/apis/apps/v1", forward: "discovery"},
		{name: "the server version", method: "GET", target: "/version", forward: "discovery"},
		{name: "discovery written to", method: "POST", target: "/apis", refuse: "discovery is read with GET only"},

		// Workloads.
		{name: "a cluster-wide list of workloads by origin", method: "GET", target: wl + "/workloads?" + byOrigin, forward: "list workloads.kueue.x-k8s.io"},
		{name: "a cluster-wide watch of workloads by origin with bookmarks", method: "GET", target: wl + "/workloads?allowWatchBookmarks=true&" + byOrigin + "&watch=true", forward: "watch workloads.kueue.x-k8s.io"},
		{name: "a watch spelt 1", method: "GET", target: wl + "/workloads?watch=1&" + byOrigin, forward: "watch workloads.kueue.x-k8s.io"},
		{name: "a list spelt watch=false", method: "GET", target: wl + "/workloads?watch=false&" + byOrigin, forward: "list workloads.kueue.x-k8s.io"},
		{name: "a watch parameter of another spelling", method: "GET", target: wl + "/workloads?watch=yes&" + byOrigin, refuse: "neither true nor false"},
		{name: "a watch parameter given twice", method: "GET", target: wl + "/workloads?watch=false&watch=true&" + byOrigin, refuse: "more than once"},
		{name: "a namespaced list of workloads by origin", method: "GET", target: wl + "/namespaces/team-a/workloads?" + byOrigin, forward: "list workloads.kueue.x-k8s.io"},

		// Lists and watches select the hub's origin, and nothing wider.
		{name: "a cluster-wide watch without a selector", method: "GET", target: wl + "/workloads?watch=true", refuse: "a watch must select kueue.x-k8s.io/multikueue-origin=hub"},
		{name: "a cluster-wide list without a selector", method: "GET", target: wl + "/workloads", refuse: "a list must select kueue.x-k8s.io/multikueue-origin=hub"},
		{name: "a watch by another label", method: "GET", target: wl + "/workloads?watch=true&labelSelector=a%3Db", refuse: "must select"},
		{name: "a watch of another origin", method: "GET", target: wl + "/workloads?watch=true&labelSelector=kueue.x-k8s.io%2Fmultikueue-origin%3Dother", refuse: "must select"},
		{name: "a watch of anything but the origin", method: "GET", target: wl + "/workloads?watch=true&labelSelector=kueue.x-k8s.io%2Fmultikueue-origin%21%3Dhub", refuse: "must select"},
		{name: "a watch of the origin and another", method: "GET", target: wl + "/workloads?watch=true&labelSelector=kueue.x-k8s.io%2Fmultikueue-origin+in+%28hub%2Cother%29", refuse: "must select"},
		{name: "a watch of whatever has the label", method: "GET", target: wl + "/workloads?watch=true&labelSelector=kueue.x-k8s.io%2Fmultikueue-origin", refuse: "must select"},
		{name: "a watch of the origin spelt in", method: "GET", target: wl + "/workloads?watch=true&labelSelector=kueue.x-k8s.io%2Fmultikueue-origin+in+%28hub%29", forward: "watch workloads.kueue.x-k8s.io"},
		{name: "a watch of the origin narrowed further", method: "GET", target: wl + "/workloads?watch=true&labelSelector=team%3Da%2Ckueue.x-k8s.io%2Fmultikueue-origin%3D%3Dhub", forward: "watch workloads.kueue.x-k8s.io"},
		{name: "a selector given twice", method: "GET", target: wl + "/workloads?watch=true&" + byOrigin + "&labelSelector=a%3Db", refuse: "given more than once"},
		{name: "a selector that does not parse", method: "GET", target: wl + "/workloads?watch=true&labelSelector=%3D%3D%3D", refuse: "does not parse"},

		// Namespaces: the fleet's workload namespaces, never the agent's own or the system's.
		{name: "a workload created in another workload namespace", method: "POST", target: wl + "/namespaces/team-b/workloads", forward: "create workloads.kueue.x-k8s.io"},
		{name: "a workload created in a namespace the fleet does not name", method: "POST", target: wl + "/namespaces/team-c/workloads", refuse: "namespace team-c is not one of this worker's workload namespaces"},
		{name: "a job created in the agent's namespace", method: "POST", target: job + "/namespaces/" + agentNamespace + "/jobs", refuse: "namespace flotilla-system is not one of"},
		{name: "a job created in kube-system", method: "POST", target: job + "/namespaces/kube-system/jobs", refuse: "namespace kube-system is not one of"},
		{name: "a job read in Kueue's namespace", method: "GET", target: job + "/namespaces/kueue-system/jobs/j", refuse: "namespace kueue-system is not one of"},
		{name: "a jobset deleted in JobSet's namespace", method: "DELETE", target: js + "/namespaces/jobset-system/jobsets/j", refuse: "namespace jobset-system is not one of"},
		{name: "a namespaced list elsewhere", method: "GET", target: wl + "/namespaces/team-c/workloads?" + byOrigin, refuse: "namespace team-c is not one of"},
		{name: "a workload read", method: "GET", target: wl + "/namespaces/team-a/workloads/job-train-1a2b3", forward: "get workloads.kueue.x-k8s.io"},
		{name: "a workload created", method: "POST", target: wl + "/namespaces/team-a/workloads", forward: "create workloads.kueue.x-k8s.io"},
		{name: "a workload updated", method: "PUT", target: wl + "/namespaces/team-a/workloads/job-train-1a2b3", forward: "update workloads.kueue.x-k8s.io"},
		{name: "a workload deleted", method: "DELETE", target: wl + "/namespaces/team-a/workloads/job-train-1a2b3", forward: "delete workloads.kueue.x-k8s.io"},
		{name: "a workload's status applied", method: "PATCH", target: wl + "/namespaces/team-a/workloads/job-train-1a2b3/status?fieldManager=kueue-admission&force=true", forward: "patch workloads/status.kueue.x-k8s.io"},
		{name: "a workload patched", method: "PATCH", target: wl + "/namespaces/team-a/workloads/job-train-1a2b3", refuse: "patch workloads.kueue.x-k8s.io is not in the allowlist"},
		{name: "a workload's status updated", method: "PUT", target: wl + "/namespaces/team-a/workloads/job-train-1a2b3/status", refuse: "update workloads/status.kueue.x-k8s.io is not in the allowlist"},
		{name: "every workload of a namespace deleted", method: "DELETE", target: wl + "/namespaces/team-a/workloads", refuse: "DELETE of a collection"},
		{name: "a workload of the older API version", method: "GET", target: "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-a/workloads/w", refuse: "not in the allowlist"},
		{name: "a workload read without its namespace", method: "GET", target: wl + "/workloads/job-train-1a2b3", refuse: "get without a namespace"},
		{name: "a workload created without a namespace", method: "POST", target: wl + "/workloads", refuse: "create without a namespace"},
		{name: "a POST to a workload's path", method: "POST", target: wl + "/namespaces/team-a/workloads/w", refuse: "POST to an object's path"},
		{name: "Kueue's other kinds", method: "GET", target: wl + "/clusterqueues", refuse: "list clusterqueues.kueue.x-k8s.io is not in the allowlist"},

		// The integrations' jobs.
		{name: "a job created", method: "POST", target: job + "/namespaces/team-a/jobs", forward: "create jobs.batch"},
		{name: "a job read", method: "GET", target: job + "/namespaces/team-a/jobs/train", forward: "get jobs.batch"},
		{name: "a job deleted", method: "DELETE", target: job + "/namespaces/team-a/jobs/train", forward: "delete jobs.batch"},
		{name: "a cluster-wide watch of jobs by origin", method: "GET", target: job + "/jobs?watch=true&" + byOrigin, forward: "watch jobs.batch"},
		{name: "a list of jobs", method: "GET", target: job + "/jobs?" + byOrigin, refuse: "list jobs.batch is not in the allowlist"},
		{name: "a job updated", method: "PUT", target: job + "/namespaces/team-a/jobs/train", refuse: "update jobs.batch"},
		{name: "a job's status", method: "GET", target: job + "/namespaces/team-a/jobs/train/status", refuse: "get jobs/status.batch"},
		{name: "a jobset created", method: "POST", target: js + "/namespaces/team-a/jobsets", forward: "create jobsets.jobset.x-k8s.io"},
		{name: "a cluster-wide watch of jobsets by origin", method: "GET", target: js + "/jobsets?watch=true&" + byOrigin, forward: "watch jobsets.jobset.x-k8s.io"},
		{name: "a jobset deleted", method: "DELETE", target: js + "/namespaces/team-a/jobsets/train", forward: "delete jobsets.jobset.x-k8s.io"},

		// What MultiKueue never asks for.
		{name: "a Secret", method: "GET", target: "/api/v1/namespaces/kube-system/secrets/admin", refuse: "get secrets is not in the allowlist"},
		{name: "every Secret", method: "GET", target: "/api/v1/secrets", refuse: "list secrets"},
		{name: "ConfigMaps", method: "GET", target: "/api/v1/namespaces/team-a/configmaps", refuse: "list configmaps"},
		{name: "nodes", method: "GET", target: "/api/v1/nodes", refuse: "list nodes"},
		{name: "a pod's exec by POST", method: "POST", target: "/api/v1/namespaces/team-a/pods/p/exec?command=sh", refuse: "POST to an object's path"},
		{name: "a pod's exec by upgrade", method: "GET", target: "/api/v1/namespaces/team-a/pods/p/exec?command=sh",
			header: http.Header{"Connection": {"Upgrade"}, "Upgrade": {"SPDY/3.1"}}, refuse: "connection upgrades"},
		{name: "a websocket upgrade on an allowed path", method: "GET", target: wl + "/workloads?watch=true",
			header: http.Header{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {"websocket"}}, refuse: "connection upgrades"},
		{name: "a namespace", method: "GET", target: "/api/v1/namespaces/team-a", refuse: "namespaces are not forwarded"},
		{name: "a namespace's finalizers", method: "PUT", target: "/api/v1/namespaces/team-a/finalize", refuse: "namespaces are not forwarded"},
		{name: "RBAC", method: "POST", target: "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", refuse: "create without a namespace"},
		{name: "a token for a ServiceAccount", method: "POST", target: "/api/v1/namespaces/team-a/serviceaccounts/default/token", refuse: "POST to an object's path"},
		{name: "the OpenAPI document", method: "GET", target: "/openapi/v2", refuse: "only discovery and resource paths"},
		{name: "health", method: "GET", target: "/healthz", refuse: "only discovery and resource paths"},

		// Paths that could be read in two ways.
		{name: "a dot-dot path", method: "GET", target: wl + "/namespaces/team-a/workloads/../../../../../api/v1/secrets", refuse: "dot segments"},
		{name: "an encoded slash", method: "GET", target: wl + "/namespaces/team-a/workloads/w%2Fstatus", refuse: "escaped characters"},
		{name: "an encoded letter", method: "GET", target: "/api/v1/namespaces/team-a/%73ecrets", refuse: "escaped characters"},
		{name: "an encoded percent sign", method: "GET", target: wl + "/namespaces/team-a/workloads/w%25", refuse: "escaped characters"},
		{name: "an empty segment", method: "GET", target: "/apis//kueue.x-k8s.io/v1beta2/workloads", refuse: "empty path segments"},
		{name: "a trailing slash", method: "GET", target: wl + "/workloads/", refuse: "empty path segments"},
		{name: "the legacy watch path", method: "GET", target: wl + "/watch/workloads", refuse: "/watch/ path form"},
		{name: "the legacy proxy path", method: "GET", target: "/api/v1/proxy/nodes/n", refuse: "/proxy/ path form"},
		{name: "a path below a subresource", method: "GET", target: wl + "/namespaces/team-a/workloads/w/status/x", refuse: "below a subresource"},
		{name: "a malformed name", method: "GET", target: wl + "/namespaces/team-a/workloads/Not_A_Name", refuse: "malformed object name"},
		{name: "a malformed namespace", method: "GET", target: wl + "/namespaces/Team/workloads", refuse: "malformed namespace"},
		{name: "a malformed group", method: "GET", target: "/apis/Kueue/v1beta2/workloads", refuse: "malformed API group"},
		{name: "an absolute-form target", method: "GET", target: "http://worker.example/api", refuse: "origin-form"},
		{name: "HEAD", method: "HEAD", target: "/api", refuse: "method HEAD"},
		{name: "OPTIONS", method: "OPTIONS", target: "/api", refuse: "method OPTIONS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, tt.target, nil)
			for k, v := range tt.header {
				r.Header[k] = v
			}
			req, ref := h.check(r, h.scope.Load())
			switch {
			case tt.forward != "" && ref != nil:
				t.Errorf("%s %s refused (%s), want it forwarded as %s", tt.method, tt.target, *ref, tt.forward)
			case tt.forward != "" && req.String() != tt.forward:
				t.Errorf("%s %s read as %s, want %s", tt.method, tt.target, req, tt.forward)
			case tt.refuse != "" && ref == nil:
				t.Errorf("%s %s forwarded as %s, want it refused (%s)", tt.method, tt.target, req, tt.refuse)
			case tt.refuse != "" && !strings.Contains(string(*ref), tt.refuse):
				t.Errorf("%s %s refused for %q, want %q", tt.method, tt.target, *ref, tt.refuse)
			}
		})
	}
}

func TestIntegrationsAreKueuesFrameworkNames(t *testing.T) {
	got, err := Integrations("batch/job")
	if err != nil || !slices.Equal(got, []Integration{{Group: "batch", Version: "v1", Resource: "jobs"}}) {
		t.Errorf("Integrations(batch/job) = %v, %v", got, err)
	}
	if _, err := Integrations("batch/job", "kubeflow.org/mpijob"); err == nil || !strings.Contains(err.Error(), `"kubeflow.org/mpijob"`) {
		t.Errorf("an integration the proxy does not know: %v, want an error naming it", err)
	}
	// Without JobSet, its jobs are not forwarded.
	rules := Allowlist(got)
	r := httptest.NewRequest("POST", js+"/namespaces/team-a/jobsets", nil)
	if req, ref := classify(r); ref != nil || allowed(rules, req) {
		t.Errorf("a JobSet create is forwarded with batch/job alone")
	}
}

// TestTheScopeIsTheFleetsNamespacesNarrowedByTheWorker pins what the worker makes of the
// scope the hub sends: its own namespace and the system's never, its administrator's
// allowlist as a bound, and nothing at all before a scope arrives.
func TestTheScopeIsTheFleetsNamespacesNarrowedByTheWorker(t *testing.T) {
	create := func(ns string) *http.Request { return httptest.NewRequest("POST", job+"/namespaces/"+ns+"/jobs", nil) }
	t.Run("before the first desired state only discovery is forwarded", func(t *testing.T) {
		h, err := New(Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}, Namespace: agentNamespace})
		if err != nil {
			t.Fatal(err)
		}
		if _, ref := h.check(create("team-a"), h.scope.Load()); ref == nil || !strings.Contains(string(*ref), "has not sent this agent a dispatch scope") {
			t.Errorf("a create before any scope: %v, want it refused", ref)
		}
		if _, ref := h.check(httptest.NewRequest("GET", "/apis", nil), h.scope.Load()); ref != nil {
			t.Errorf("discovery before any scope refused: %s", *ref)
		}
	})
	t.Run("a request before the first scope waits for it, then is refused", func(t *testing.T) {
		h, err := New(Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}, Namespace: agentNamespace, ScopeWait: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, create("team-a"))
		if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "has not sent this agent a dispatch scope") {
			t.Errorf("a create before any scope: HTTP %d %s", w.Code, w.Body)
		}
	})
	t.Run("reserved namespaces are left out and said why", func(t *testing.T) {
		h := scoped(t, nil, Scope{})
		excluded, err := h.SetScope(t.Context(), fleetScope)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			agentNamespace:  "the agent's own namespace",
			"kube-system":   "a Kubernetes system namespace",
			"kueue-system":  "where the worker's Kueue and JobSet run",
			"jobset-system": "where the worker's Kueue and JobSet run",
		}
		for _, e := range excluded {
			if !strings.Contains(e.Reason, want[e.Namespace]) || want[e.Namespace] == "" {
				t.Errorf("%s left out because %q", e.Namespace, e.Reason)
			}
			delete(want, e.Namespace)
		}
		if len(want) > 0 {
			t.Errorf("not left out: %v", want)
		}
		if got := h.Scope().Namespaces; !slices.Equal(got, []string{"team-a", "team-b"}) {
			t.Errorf("scope %v, want team-a and team-b", got)
		}
	})
	t.Run("the administrator's allowlist bounds what Git names", func(t *testing.T) {
		h, err := New(Options{Config: &rest.Config{Host: "https://127.0.0.1:1"}, Namespace: agentNamespace, Namespaces: []string{"team-a", "team-z"}})
		if err != nil {
			t.Fatal(err)
		}
		excluded, err := h.SetScope(t.Context(), Scope{Origin: "hub", Namespaces: []string{"team-a", "team-b"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(excluded) != 1 || excluded[0].Namespace != "team-b" || !strings.Contains(excluded[0].Reason, "dispatch.namespaces in the agent's Helm values") {
			t.Errorf("left out %+v, want team-b for the allowlist", excluded)
		}
		if _, ref := h.check(create("team-a"), h.scope.Load()); ref != nil {
			t.Errorf("a create in team-a refused: %s", *ref)
		}
		for _, ns := range []string{"team-b", "team-z"} {
			if _, ref := h.check(create(ns), h.scope.Load()); ref == nil {
				t.Errorf("a create in %s forwarded", ns)
			}
		}
	})
	t.Run("a scope without a usable origin closes the proxy", func(t *testing.T) {
		h := scoped(t, nil, fleetScope)
		if _, err := h.SetScope(t.Context(), Scope{Origin: "not a label value!", Namespaces: []string{"team-a"}}); err != nil {
			t.Fatal(err)
		}
		if _, ref := h.check(create("team-a"), h.scope.Load()); ref == nil {
			t.Error("a create forwarded under an unusable origin")
		}
	})
}
