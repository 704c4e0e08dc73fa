// Package proxy is the agent's end of the hub's Kubernetes API proxy: it forwards the
// requests that Kueue's MultiKueue on the hub makes of this worker to the worker's API
// server, under a narrow identity of its own, and refuses everything else. The worker's
// credentials never leave the worker; the hub reaches its API server only through this.
//
// # Identity
//
// Requests are forwarded as the ServiceAccount flotilla-dispatch of the agent's
// namespace (DefaultServiceAccount): the agent authenticates as itself and impersonates
// it, and the API server gives the impersonated account its own groups. The agent chart
// binds that account to exactly the allowlist (PolicyRules) and lets the agent
// impersonate that one account, nothing more; a test compares the chart's ClusterRole
// with Allowlist.
//
// Whatever identity a request names is dropped before it is forwarded:
// Authorization, Proxy-Authorization, Cookie, every Impersonate-* header and the front
// proxy's X-Remote-* headers. client-go would keep a caller's Authorization, skip its
// own impersonation for a caller's Impersonate-User and add to a caller's
// Impersonate-Group, so any of them let through would be an escalation.
// Hop-by-hop headers go too (httputil.ReverseProxy).
//
// # Allowlist
//
// A request is read as the API server's authorizer reads it (verb, group, version,
// namespace, resource, subresource, name), strictly: an escaped character in the path,
// an empty or dot segment, a /watch/ or /proxy/ path, a path below a subresource, a
// malformed name, a watch parameter other than true, false, 1 or 0 (or given twice), a
// connection upgrade (exec, attach, port-forward) and a method other than GET, POST,
// PUT, PATCH and DELETE are refused. What remains is forwarded if it is
//
//   - discovery: GET /version, /api, /api/<v>, /apis, /apis/<g>, /apis/<g>/<v> (the
//     RESTMapper of Kueue's worker client; every authenticated user may read these);
//   - or in the allowlist (Allowlist): what Kueue v0.17.0's MultiKueue calls on a worker
//     with its default feature gates (pkg/controller/admissionchecks/multikueue and the
//     batch/Job and JobSet adapters).
//
// The allowlist, with the default integrations:
//
//	kueue.x-k8s.io/v1beta2 workloads         get list watch create update delete
//	kueue.x-k8s.io/v1beta2 workloads/status  patch
//	batch/v1 jobs                            get watch create delete
//	jobset.x-k8s.io/v1alpha2 jobsets         get watch create delete
//
// Lists and watches may span namespaces (MultiKueue watches every namespace, selecting
// by its multikueue-origin label); every other verb names a namespace. The integrations
// (jobs, jobsets) are a parameter: the ones the hub's Kueue enables (Integrations). The
// alpha gates MultiKueueOrchestratedPreemption (update of workloads/status) and
// ElasticJobsViaWorkloadSlices (patch of jobs) would need more and are not served.
//
// Anything else, core resources such as Secrets, ConfigMaps, Pods and Nodes among them,
// is answered 403 with a Kubernetes Status saying why, and logged with its method, path
// and reason (the first ten, then one each ten seconds, with a running count).
//
// # Caps
//
// A request body over MaxBodyBytes (3 MiB, the API server's own object limit) is
// answered 413, before anything is forwarded when its length is declared, else when the
// cap is crossed. At most MaxConcurrent requests (64) are in flight, watches included;
// one more is answered 429 with Retry-After, which client-go waits for and retries.
//
// # Serving
//
// The hub opens a tunnel stream per HTTP/1.1 connection (protocol.StreamProxy); the
// agent hands each to a Listener, served by NewServer: no read or write timeout, so a
// watch streams as long as the hub reads it, and every write is flushed at once. Each
// stream has its own flow-control window in the tunnel, so a hub that stops reading one
// watch holds up that request only.
package proxy
