package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Integration is a kind of job that the hub's MultiKueue dispatches: the resource the
// hub creates, reads, watches and deletes on the worker.
type Integration struct {
	Group    string // "batch"
	Version  string // "v1"
	Resource string // "jobs"
}

// Integrations maps Kueue's integration names, as the hub's Kueue Configuration lists
// them under integrations.frameworks, to the resources they dispatch. A name without
// a MultiKueue adapter this proxy knows is an error, not skipped: its jobs would be
// refused on every worker.
func Integrations(frameworks ...string) ([]Integration, error) {
	var out []Integration
	for _, f := range frameworks {
		switch f {
		case "batch/job":
			out = append(out, Integration{Group: "batch", Version: "v1", Resource: "jobs"})
		case "jobset.x-k8s.io/jobset":
			out = append(out, Integration{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"})
		default:
			return nil, fmt.Errorf("proxy: integration %q is not one the proxy forwards (batch/job, jobset.x-k8s.io/jobset)", f)
		}
	}
	return out, nil
}

// DefaultIntegrations are batch/job and jobset.x-k8s.io/jobset.
func DefaultIntegrations() []Integration {
	out, _ := Integrations(DefaultFrameworks()...)
	return out
}

// DefaultFrameworks are the Kueue integration names of DefaultIntegrations.
func DefaultFrameworks() []string { return []string{"batch/job", "jobset.x-k8s.io/jobset"} }

// Rule is one entry of the allowlist: the verbs allowed on a resource of one API group
// and version. Resource is written as RBAC writes it: "workloads", or
// "workloads/status" for a subresource.
type Rule struct {
	Group    string
	Version  string
	Resource string
	Verbs    []string
}

// Allowlist is every resource request the proxy forwards, given the hub's integrations:
// exactly what Kueue v0.17's MultiKueue calls on a worker with its default feature
// gates. Discovery is allowed besides (see the package doc) and is no Rule.
func Allowlist(integrations []Integration) []Rule {
	rules := []Rule{
		// The workload mirror: read, created from the hub's, updated (finalizer removal,
		// spec changes), deleted, listed by the garbage collector and watched, both
		// cluster-wide by the multikueue-origin label.
		{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads", Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		// Admission status written by server-side apply (workload.PatchAdmissionStatus).
		{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads/status", Verbs: []string{"patch"}},
	}
	for _, in := range integrations {
		// The job itself: read (its status is copied to the hub), created, deleted and
		// watched cluster-wide by the multikueue-origin label. Never listed or updated.
		rules = append(rules, Rule{Group: in.Group, Version: in.Version, Resource: in.Resource, Verbs: []string{"get", "watch", "create", "delete"}})
	}
	return rules
}

// PolicyRules are the RBAC rules that grant exactly rules, wherever they are bound.
// RBAC does not tell versions apart; the proxy does.
func PolicyRules(rules []Rule) []rbacv1.PolicyRule {
	return policyRules(rules, func(string) bool { return true })
}

// NamespacedPolicyRules are the rules the proxy's identity holds in the namespaces of
// the proxy's scope only: a ClusterRole the agent binds there with RoleBindings
// (Options.ClusterRole). Every verb but list and watch.
func NamespacedPolicyRules(rules []Rule) []rbacv1.PolicyRule {
	return policyRules(rules, func(v string) bool { return v != "list" && v != "watch" })
}

// ClusterPolicyRules are the rules the proxy's identity holds across namespaces, bound
// by a ClusterRoleBinding: list and watch, which MultiKueue makes of every namespace at
// once, selecting by its origin label. RBAC cannot narrow them by label; the proxy does.
func ClusterPolicyRules(rules []Rule) []rbacv1.PolicyRule {
	return policyRules(rules, func(v string) bool { return v == "list" || v == "watch" })
}

func policyRules(rules []Rule, keep func(verb string) bool) []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, 0, len(rules))
	for _, r := range rules {
		var verbs []string
		for _, v := range r.Verbs {
			if keep(v) {
				verbs = append(verbs, v)
			}
		}
		if len(verbs) > 0 {
			out = append(out, rbacv1.PolicyRule{APIGroups: []string{r.Group}, Resources: []string{r.Resource}, Verbs: verbs})
		}
	}
	return out
}

// request is what a proxied request asks for, as the API server's authorizer reads it.
type request struct {
	discovery bool
	verb      string
	group     string
	version   string
	namespace string
	resource  string // with "/subresource"
	name      string
}

func (r request) String() string {
	if r.discovery {
		return "discovery"
	}
	gr := r.resource
	if r.group != "" {
		gr += "." + r.group
	}
	return r.verb + " " + gr
}

// refusal is why a request is not forwarded, in words for the caller and the log.
type refusal string

func refusef(format string, args ...any) *refusal {
	r := refusal(fmt.Sprintf(format, args...))
	return &r
}

// classify reads a request the way the API server's RequestInfoFactory does, but
// strictly: whatever it could read in two ways, or that MultiKueue never sends, is
// refused rather than guessed at.
func classify(r *http.Request) (request, *refusal) {
	switch r.Method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return request{}, refusef("method %s is not forwarded", r.Method)
	}
	// Exec, attach, port-forward and every other upgrade: MultiKueue uses none.
	if r.Header.Get("Upgrade") != "" || headerHasToken(r.Header, "Connection", "upgrade") {
		return request{}, refusef("connection upgrades are not forwarded")
	}
	if !strings.HasPrefix(r.RequestURI, "/") || r.URL.Opaque != "" {
		return request{}, refusef("only origin-form request targets are forwarded")
	}
	// An escaped character in the path (%2F above all) makes the path mean one thing
	// here and maybe another upstream. No name MultiKueue uses needs escaping.
	if r.URL.RawPath != "" || strings.Contains(r.URL.Path, "%") {
		return request{}, refusef("escaped characters in the path are not forwarded")
	}
	if r.URL.Path == "/" || strings.HasSuffix(r.URL.Path, "/") || strings.Contains(r.URL.Path, "//") {
		return request{}, refusef("empty path segments are not forwarded")
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	for _, p := range parts {
		if p == "." || p == ".." {
			return request{}, refusef("dot segments are not forwarded")
		}
	}

	if d, ok, ref := classifyDiscovery(r, parts); ok || ref != nil {
		return d, ref
	}

	var req request
	var rest []string
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		req.version, rest = parts[1], parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		req.group, req.version, rest = parts[1], parts[2], parts[3:]
		if msgs := validation.IsDNS1123Subdomain(req.group); len(msgs) > 0 {
			return request{}, refusef("malformed API group in the path")
		}
	default:
		return request{}, refusef("only discovery and resource paths are forwarded")
	}
	if msgs := validation.IsDNS1123Label(req.version); len(msgs) > 0 {
		return request{}, refusef("malformed API version in the path")
	}
	switch rest[0] {
	case "watch", "proxy":
		return request{}, refusef("the /%s/ path form is not forwarded", rest[0])
	case "namespaces":
		// /namespaces, /namespaces/<ns> and /namespaces/<ns>/{status,finalize} are the
		// Namespace resource itself, which MultiKueue never touches.
		if len(rest) < 3 || rest[2] == "status" || rest[2] == "finalize" {
			return request{}, refusef("namespaces are not forwarded")
		}
		req.namespace, rest = rest[1], rest[2:]
		if msgs := validation.IsDNS1123Label(req.namespace); len(msgs) > 0 {
			return request{}, refusef("malformed namespace in the path")
		}
	}
	if len(rest) > 3 {
		return request{}, refusef("paths below a subresource are not forwarded")
	}
	req.resource = rest[0]
	if msgs := validation.IsDNS1123Label(req.resource); len(msgs) > 0 {
		return request{}, refusef("malformed resource in the path")
	}
	if len(rest) >= 2 {
		req.name = rest[1]
		if msgs := validation.IsDNS1123Subdomain(req.name); len(msgs) > 0 {
			return request{}, refusef("malformed object name in the path")
		}
	}
	if len(rest) == 3 {
		if msgs := validation.IsDNS1123Label(rest[2]); len(msgs) > 0 {
			return request{}, refusef("malformed subresource in the path")
		}
		req.resource += "/" + rest[2]
	}

	switch {
	case r.Method == http.MethodGet && req.name == "":
		watch, ref := watchParam(r)
		if ref != nil {
			return request{}, ref
		}
		req.verb = "list"
		if watch {
			req.verb = "watch"
		}
	case r.Method == http.MethodGet:
		req.verb = "get"
	case r.Method == http.MethodPost && req.name == "":
		req.verb = "create"
	case r.Method == http.MethodPost:
		return request{}, refusef("POST to an object's path is not forwarded")
	case req.name == "":
		// PUT or PATCH of a collection means nothing; DELETE of one is deletecollection,
		// which MultiKueue never sends.
		return request{}, refusef("%s of a collection is not forwarded", r.Method)
	case r.Method == http.MethodPut:
		req.verb = "update"
	case r.Method == http.MethodPatch:
		req.verb = "patch"
	case r.Method == http.MethodDelete:
		req.verb = "delete"
	}
	// Every resource MultiKueue reaches is namespaced: only a list or a watch spans
	// namespaces.
	if req.namespace == "" && req.verb != "list" && req.verb != "watch" {
		return request{}, refusef("%s without a namespace is not forwarded", req.verb)
	}
	return req, nil
}

// classifyDiscovery recognizes the discovery documents: /version, /api, /api/<v>,
// /apis, /apis/<g> and /apis/<g>/<v>, read with GET. ok is false for any other path.
func classifyDiscovery(r *http.Request, parts []string) (req request, ok bool, ref *refusal) {
	switch {
	case len(parts) == 1 && (parts[0] == "version" || parts[0] == "api" || parts[0] == "apis"):
	case len(parts) == 2 && parts[0] == "api":
		if msgs := validation.IsDNS1123Label(parts[1]); len(msgs) > 0 {
			return request{}, true, refusef("malformed API version in the path")
		}
	case len(parts) == 2 && parts[0] == "apis":
		if msgs := validation.IsDNS1123Subdomain(parts[1]); len(msgs) > 0 {
			return request{}, true, refusef("malformed API group in the path")
		}
	case len(parts) == 3 && parts[0] == "apis":
		if msgs := validation.IsDNS1123Subdomain(parts[1]); len(msgs) > 0 {
			return request{}, true, refusef("malformed API group in the path")
		}
		if msgs := validation.IsDNS1123Label(parts[2]); len(msgs) > 0 {
			return request{}, true, refusef("malformed API version in the path")
		}
	default:
		return request{}, false, nil
	}
	if r.Method != http.MethodGet {
		return request{}, true, refusef("discovery is read with GET only")
	}
	return request{discovery: true, verb: "get"}, true, nil
}

// watchParam reads the watch query parameter as the API server does, refusing a value
// it might read otherwise than this proxy.
func watchParam(r *http.Request) (bool, *refusal) {
	vals, ok := r.URL.Query()["watch"]
	if !ok {
		return false, nil
	}
	if len(vals) != 1 {
		return false, refusef("the watch parameter is given more than once")
	}
	switch strings.ToLower(vals[0]) {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, refusef("the watch parameter is neither true nor false")
}

// allowed finds the rule that allows req.
func allowed(rules []Rule, req request) bool {
	for _, rule := range rules {
		if rule.Group == req.group && rule.Version == req.version && rule.Resource == req.resource && slices.Contains(rule.Verbs, req.verb) {
			return true
		}
	}
	return false
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
