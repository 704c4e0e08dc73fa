// Package integration holds tests that check flotilla's output against real Kubernetes
// API servers carrying Kueue's and JobSet's own CRDs.
package integration
