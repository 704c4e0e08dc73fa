// Package demo runs flotilla's whole flow on one machine, from a fresh clone, as
// `make demo` does: three real control planes (the hub's and two GPU workers'), the real
// Kueue manager on each (the hub's as MultiKueue manager with
// reconciler/dispatch.HubKueueConfiguration, the workers' with
// WorkerKueueConfiguration), a git server holding a fleet repository made with the CLI,
// the hub (with its API proxy for Kueue) and two agents as processes, and two clusters
// enrolled through pull requests and merges, watched in a live table until their
// commits turn green: ready and dispatchable.
//
// Then it dispatches: a batch Job submitted to the hub's LocalQueue of the clusters'
// dispatch pool is admitted by the hub's Kueue, created on one worker by MultiKueue
// through the hub's API proxy and that worker's tunnel (the agent forwards it as the
// chart's flotilla-dispatch ServiceAccount, whose RBAC the demo creates as the chart
// would), and finishes on the hub with the worker's status copied back. No kubelet runs
// on these machines: the demo plays the worker's nodes by writing the worker Job's
// status, and says so where it does.
//
// The demo is a test behind the demo build tag, so that it can use the project's test
// harness (which works through testing.TB) while `go test ./...` never compiles it:
//
//	make demo                      # a live table, the job, then a guide; Ctrl-C stops everything
//	FLOTILLA_DEMO_CI=1 make demo   # exits 0 once the job finished on the hub, else fails with the reason
//
// FLOTILLA_DEMO_TIMEOUT (default 5m) bounds the time from the start of the control planes
// to the job finished on the hub. Past it the CI mode fails with the last statuses and
// the tails of the logs; the interactive mode prints the same and keeps everything
// running to be looked at.
package demo
