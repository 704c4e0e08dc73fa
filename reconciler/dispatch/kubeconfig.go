package dispatch

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeConfigKey is the key of the kubeconfig in its Secret, where Kueue reads it.
const KubeConfigKey = "kubeconfig"

// kubeConfig is the kubeconfig of a worker's MultiKueueCluster in the one form Kueue's
// validation accepts: an https server, the CA inline, a bearer token inline.
func kubeConfig(server string, caBundle []byte, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["worker"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caBundle}
	cfg.AuthInfos["dispatch"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["worker"] = &clientcmdapi.Context{Cluster: "worker", AuthInfo: "dispatch"}
	cfg.CurrentContext = "worker"
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("writing the kubeconfig for %s: %w", server, err)
	}
	return b, nil
}

// tokenOf is the bearer token and CA of a kubeconfig the hub wrote; empty when it is
// not one.
func tokenOf(data []byte) (token string, ca []byte, server string) {
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return "", nil, ""
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || cfg.AuthInfos[ctx.AuthInfo] == nil || cfg.Clusters[ctx.Cluster] == nil {
		return "", nil, ""
	}
	c := cfg.Clusters[ctx.Cluster]
	return cfg.AuthInfos[ctx.AuthInfo].Token, c.CertificateAuthorityData, c.Server
}
