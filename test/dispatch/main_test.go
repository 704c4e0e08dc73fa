package dispatch

import (
	"testing"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes[0] is the hub, planes[1] the eu worker, planes[2] the us worker.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, 3, &planes, controlplane.Options{})
}
