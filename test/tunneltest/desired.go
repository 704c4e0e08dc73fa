// Package tunneltest holds what tests of the hub's tunnel share: a source of desired
// states that a test sets by hand, as the hub's reconciler would from a fleet repository.
package tunneltest

import (
	"context"
	"sync"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Desired is a tunnel.DesiredStates of states set by identity. Its zero value is ready;
// it is safe for concurrent use.
type Desired struct {
	mu    sync.Mutex
	state map[string]*protocol.DesiredState // by identity
}

// Desired returns the state set for the WorkerCluster's identity, or nil.
func (d *Desired) Desired(_ context.Context, wc *v1alpha1.WorkerCluster) (*protocol.DesiredState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.state[wc.Labels[v1alpha1.WorkerClusterLabel]], nil
}

// Set makes ds the identity's desired state.
func (d *Desired) Set(identity string, ds *protocol.DesiredState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == nil {
		d.state = map[string]*protocol.DesiredState{}
	}
	d.state[identity] = ds
}
