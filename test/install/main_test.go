package install

import (
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes[0] is the hub cluster, planes[1] the worker gpu-east. Neither has flotilla's, Kueue's or
// JobSet's CRDs: the README installs the hub's chart (with flotilla's CRDs) and Kueue on the
// hub, and the agent installs Kueue and JobSet on the worker.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	// controller-runtime's clients log through its global logger, which complains with a
	// stack trace when unset; the test reads what it needs from the API servers.
	ctrllog.SetLogger(logr.Discard())
	controlplane.Main(m, 2, &planes, controlplane.Options{WithoutComponentCRDs: true, WithoutFlotillaCRDs: true})
}
