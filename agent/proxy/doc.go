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
// grants that account exactly the allowlist, split in two (ClusterPolicyRules across
// namespaces, NamespacedPolicyRules where the agent binds them, see Scope), and lets
// the agent impersonate that one account, nothing more; a test compares the chart's
// ClusterRoles with Allowlist.
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
// # Scope
//
// What the allowlist allows is forwarded only within the scope of the desired state the
// agent last applied (Scope, from protocol.Dispatch): the hub's MultiKueue origin and
// the fleet's workload namespaces. Until the agent applied one, and after a
// decommission, only discovery is forwarded.
//
//   - A request that names a namespace is forwarded only in a workload namespace of that
//     state, intersected with Options.Namespaces when the worker's administrator set
//     them (the chart's dispatch.namespaces), and never in the agent's own namespace,
//     kube-* or kueue-system and jobset-system, whatever the hub sends: fleet validation
//     refuses those (and default) too, but cannot know the agent's namespace.
//   - A list or a watch, across namespaces or in one, must select the label
//     kueue.x-k8s.io/multikueue-origin equal to the hub's origin (=, == or in with that
//     one value; further requirements only narrow it), as Kueue v0.17.0's MultiKueue
//     always does: its watches of Workloads and of each integration's kind, and its
//     garbage collector's list of Workloads, all select client.MatchingLabels{origin}.
//   - A create must carry that label, as every object MultiKueue creates does
//     (cloneForCreate, and the Job and JobSet adapters' SyncJob).
//   - A read of one object is forwarded and its answer checked, in JSON (the agent asks
//     for JSON, which every client reads): an object without the label is answered 403.
//   - An update, a patch (server-side apply or merge patch only) and a delete first read
//     the live object's metadata as the dispatch identity and are refused unless it
//     carries the label; the request then goes with that object's UID, as the
//     precondition of a delete and of an update (its metadata.uid), and with its
//     resource version as well in a patch (a status patch drops what it says of the
//     rest of metadata). An object deleted and made again under the same name in
//     between (without the label) is therefore never the one written. An update or
//     patch may not take the label off or change it.
//
// Bodies are read as the API server reads them: JSON, YAML for server-side apply, and
// protobuf, in which controller-runtime's clients send Kubernetes' own kinds (Jobs, and
// the DeleteOptions of their deletes); what is rewritten goes on as JSON. Bodies and
// answers held to be checked are bounded by MaxBodyBytes each and MaxInspecting at once.
//
// Objects left in a namespace the fleet dropped stay on the worker: the agent prunes
// its own LocalQueues there, never a namespace or a job, so running work runs to its
// end under the worker's Kueue. The hub can no longer read, change or delete them: its
// lists and watches by origin still show them, and its garbage collector's deletes are
// refused. The worker's administrator removes them, or the fleet names the namespace
// again.
//
// # What the API server refuses too
//
// The agent's checks stand in front of the worker's RBAC, which refuses again what it
// can express, should the agent ever let a request through:
//
//   - Namespaces. What MultiKueue does to one object (NamespacedPolicyRules) is granted
//     by a ClusterRole (Options.ClusterRole) that the agent binds, with a RoleBinding of
//     the same name labelled BindingLabel, in each namespace of its scope and in no
//     other: a namespace enters the scope after its RoleBinding is written, and leaves
//     it before the RoleBinding is deleted. The agent may write RoleBindings of that
//     name only, and bind that ClusterRole only; it lists RoleBindings to find those it
//     wrote in namespaces the fleet dropped.
//   - Verbs and resources: the allowlist, as RBAC writes it; only list and watch
//     (ClusterPolicyRules) are granted across namespaces.
//
// What only the agent enforces, since RBAC cannot express it: the origin label (on
// lists and watches, creates, and the objects read and written), the UID
// preconditions, the API versions (RBAC does not tell them apart), and the strict
// reading of paths. A list or watch across namespaces is granted by RBAC in
// every namespace; the agent admits it only by the hub's origin.
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
