// Package workerconfig finds the worker cluster's API server for the binaries that run
// there, the agent and its installer, by one rule: the pod's service account, else
// $KUBECONFIG. Nothing else is looked at: a binary that quietly picked up someone's
// ~/.kube/config would act on whatever cluster that names.
package workerconfig

import (
	"errors"
	"fmt"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// KubeconfigEnv is the environment variable read outside a pod.
const KubeconfigEnv = "KUBECONFIG"

// ErrNowhere: not in a pod, and $KUBECONFIG is not set.
var ErrNowhere = errors.New("not running in a pod, and $" + KubeconfigEnv + " is not set")

// InClusterOrEnv is the pod's service account, else the kubeconfig files $KUBECONFIG
// lists.
func InClusterOrEnv(getenv func(string) string) (*rest.Config, error) {
	cfg, err := rest.InClusterConfig()
	if err == nil {
		return cfg, nil
	}
	if !errors.Is(err, rest.ErrNotInCluster) {
		return nil, fmt.Errorf("loading the in-cluster configuration: %w", err)
	}
	env := getenv(KubeconfigEnv)
	if env == "" {
		return nil, ErrNowhere
	}
	rules := &clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(env)}
	cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	switch {
	case err == nil:
		return cfg, nil
	case clientcmd.IsEmptyConfig(err) || clientcmd.IsConfigurationInvalid(err):
		return nil, fmt.Errorf("loading $%s (%s): %w", KubeconfigEnv, env, err)
	default:
		// Other errors can quote the file, credentials included.
		return nil, fmt.Errorf("loading $%s (%s): not a readable kubeconfig", KubeconfigEnv, env)
	}
}
