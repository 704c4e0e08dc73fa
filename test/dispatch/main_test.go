package dispatch

import (
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes[0] is the hub, planes[1] the eu worker, planes[2] the us worker.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	// controller-runtime's clients and caches log through its global logger, which
	// complains with a stack trace when unset; the tests read what they need from the
	// API servers.
	ctrllog.SetLogger(logr.Discard())
	controlplane.Main(m, 3, &planes, controlplane.Options{})
}
