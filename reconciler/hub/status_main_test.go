package hub

import (
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes[0] is the hub cluster of the tests that run a hub against a real API server.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}
