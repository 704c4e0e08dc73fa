package agent_test

import (
	"testing"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes[0] is the worker cluster the agents under test store their credential in.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, 1, &planes, controlplane.Options{WithoutComponentCRDs: true})
}
