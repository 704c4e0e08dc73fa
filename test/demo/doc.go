// Package demo runs flotilla's whole flow on one machine, from a fresh clone, as
// `make demo` does: three real control planes (the hub's and two GPU workers'), a git
// server holding a fleet repository made with the CLI, the hub and two agents as
// processes, and two clusters enrolled through pull requests and merges, watched in a
// live table until their commits turn green.
//
// The demo is a test behind the demo build tag, so that it can use the project's test
// harness (which works through testing.TB) while `go test ./...` never compiles it:
//
//	make demo                      # a live table, then a guide; Ctrl-C stops everything
//	FLOTILLA_DEMO_CI=1 make demo   # exits 0 once both clusters are green, else fails with the reason
//
// FLOTILLA_DEMO_TIMEOUT (default 5m) bounds the time from the start of the control planes
// to both clusters being green. Past it the CI mode fails with the last statuses and the
// tails of the logs; the interactive mode prints the same and keeps everything running to
// be looked at.
package demo
