package dispatch

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent/proxy"
)

// Origin is the MultiKueue origin of the hub's Kueue: the label value it puts on what it
// creates on the workers, and selects them by.
const Origin = "flotilla-hub"

// DefaultWorkerLostTimeout is how long the hub's Kueue waits for a worker it lost
// before it requeues the work placed there. Kueue's default is 15 minutes; Kueue
// v0.17.0 also requeues work admitted longer ago than this when a watch to a worker
// merely restarts (kueue#12999, fixed in a later v0.17 patch release), so a long
// timeout narrows that window. The API proxy already hides tunnel blips shorter than
// its resume window from Kueue.
const DefaultWorkerLostTimeout = time.Hour

// HubKueueConfiguration is what dispatch needs of the hub's Kueue configuration:
// MultiKueue with flotilla's origin and a worker-lost timeout, and the integrations
// whose kinds the agents' proxies serve (every worker must serve each enabled
// integration's kind, or Kueue cannot reach it at all). The rest of the
// configuration (namespace, webhooks, metrics, leader election) is the installer's.
func HubKueueConfiguration(workerLostTimeout time.Duration) *configapi.Configuration {
	if workerLostTimeout <= 0 {
		workerLostTimeout = DefaultWorkerLostTimeout
	}
	return &configapi.Configuration{
		TypeMeta: metav1.TypeMeta{APIVersion: configapi.GroupVersion.String(), Kind: "Configuration"},
		MultiKueue: &configapi.MultiKueue{
			Origin:            ptr.To(Origin),
			WorkerLostTimeout: &metav1.Duration{Duration: workerLostTimeout},
		},
		Integrations: &configapi.Integrations{Frameworks: proxy.DefaultFrameworks()},
	}
}

// WorkerKueueConfiguration is what dispatch needs of a worker's Kueue: the same
// integrations as the hub's, so that the jobs MultiKueue creates there are queued.
func WorkerKueueConfiguration() *configapi.Configuration {
	return &configapi.Configuration{
		TypeMeta:     metav1.TypeMeta{APIVersion: configapi.GroupVersion.String(), Kind: "Configuration"},
		Integrations: &configapi.Integrations{Frameworks: proxy.DefaultFrameworks()},
	}
}
