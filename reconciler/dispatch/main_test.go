package dispatch

import (
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes[0] is the hub cluster of the tests that sync tenants against a real API
// server with Kueue's CRDs.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}
