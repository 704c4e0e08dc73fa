package proxy

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

const (
	wl  = "/apis/kueue.x-k8s.io/v1beta2"
	job = "/apis/batch/v1"
	js  = "/apis/jobset.x-k8s.io/v1alpha2"
)

// TestRequestsAreForwardedOnlyIfMultiKueueMakesThem reads requests as the proxy does and
// checks which it forwards: what it forwards is said as the API server's authorizer
// would (verb and resource), what it refuses with the reason the caller is told.
func TestRequestsAreForwardedOnlyIfMultiKueueMakesThem(t *testing.T) {
	rules := Allowlist(DefaultIntegrations())
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
		{name: "a cluster-wide list of workloads by origin", method: "GET", target: wl + "/workloads?labelSelector=kueue.x-k8s.io%2Fmultikueue-origin%3Dhub", forward: "list workloads.kueue.x-k8s.io"},
		{name: "a cluster-wide watch of workloads with bookmarks", method: "GET", target: wl + "/workloads?allowWatchBookmarks=true&labelSelector=a%3Db&watch=true", forward: "watch workloads.kueue.x-k8s.io"},
		{name: "a watch spelt 1", method: "GET", target: wl + "/workloads?watch=1", forward: "watch workloads.kueue.x-k8s.io"},
		{name: "a list spelt watch=false", method: "GET", target: wl + "/workloads?watch=false", forward: "list workloads.kueue.x-k8s.io"},
		{name: "a watch parameter of another spelling", method: "GET", target: wl + "/workloads?watch=yes", refuse: "neither true nor false"},
		{name: "a watch parameter given twice", method: "GET", target: wl + "/workloads?watch=false&watch=true", refuse: "more than once"},
		{name: "a namespaced list of workloads", method: "GET", target: wl + "/namespaces/team-a/workloads", forward: "list workloads.kueue.x-k8s.io"},
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
		{name: "a cluster-wide watch of jobs", method: "GET", target: job + "/jobs?watch=true&labelSelector=a%3Db", forward: "watch jobs.batch"},
		{name: "a list of jobs", method: "GET", target: job + "/jobs", refuse: "list jobs.batch is not in the allowlist"},
		{name: "a job updated", method: "PUT", target: job + "/namespaces/team-a/jobs/train", refuse: "update jobs.batch"},
		{name: "a job's status", method: "GET", target: job + "/namespaces/team-a/jobs/train/status", refuse: "get jobs/status.batch"},
		{name: "a jobset created", method: "POST", target: js + "/namespaces/team-a/jobsets", forward: "create jobsets.jobset.x-k8s.io"},
		{name: "a cluster-wide watch of jobsets", method: "GET", target: js + "/jobsets?watch=true", forward: "watch jobsets.jobset.x-k8s.io"},
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
			req, ref := classify(r)
			if ref == nil && !req.discovery && !allowed(rules, req) {
				ref = refusef("%s is not in the allowlist", req)
			}
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
