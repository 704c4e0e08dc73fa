package main

import (
	"testing"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes holds one worker control plane, on which the agent runs under the chart's RBAC.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}
