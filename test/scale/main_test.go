// Package scale measures the hub at the size it is built for, ten thousand clusters,
// on a real hub cluster (kube-apiserver and etcd) with the agents simulated at the
// protocol level: they enroll, acknowledge every desired state and send heartbeats
// like real agents, without a worker API server. Its tests pin what a commit costs the
// hub cluster in requests; its benchmarks (make bench) measure push to success at
// several fleet sizes side by side, a fleet-wide change, and a hub's cold start.
package scale

import (
	"io"
	"log"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes[0] is the hub cluster; there are no workers.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	if spec := os.Getenv(agentsEnv); spec != "" {
		os.Exit(simulateAgents(spec))
	}
	ctrllog.SetLogger(logr.Discard())
	// The git server's library logs every request through the standard logger: at
	// thousands of pushes, that would bury the benchmarks' figures.
	log.SetOutput(io.Discard)
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}

func admin() client.Client { return planes[0].Client }
