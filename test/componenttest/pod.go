package componenttest

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"path"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// defaultContainerAnnotation names the main container of a multi-container pod (kubectl's
// convention; Kueue's chart sets it).
const defaultContainerAnnotation = "kubectl.kubernetes.io/default-container"

// tokenLifetime is how long a manager's ServiceAccount token is valid: longer than any test.
const tokenLifetime = 24 * time.Hour

// podSpec is what a Deployment's pod template asks the kubelet to run, resolved against the
// plane: the container's image and arguments and the file its --config argument names.
type podSpec struct {
	// hash tells pod templates apart, as the pod-template-hash label does.
	hash       string
	generation int64
	replicas   int32
	strategy   appsv1.DeploymentStrategyType
	namespace  string

	container      string
	image          string
	args           []string
	serviceAccount string

	// configPath is the file the --config argument names, config its content (nil when the
	// container has no --config argument).
	configPath string
	config     []byte
}

// templateHash hashes a pod template as the deployment controller does for its
// pod-template-hash label (FNV-32a, encoded with the same safe alphabet), here over the
// template's JSON: any change of the template changes it.
func templateHash(t *corev1.PodTemplateSpec) (string, error) {
	data, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("hashing pod template: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write(data)
	return rand.SafeEncodeString(strconv.FormatUint(uint64(h.Sum32()), 10)), nil
}

// resolve reads what the kubelet would need to start the Deployment's pod: the main container
// and the configuration file mounted where its --config argument points.
func resolve(ctx context.Context, cs kubernetes.Interface, dep *appsv1.Deployment) (*podSpec, error) {
	hash, err := templateHash(&dep.Spec.Template)
	if err != nil {
		return nil, err
	}
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) == 0 {
		return nil, fmt.Errorf("deployment %s/%s: the pod template has no container", dep.Namespace, dep.Name)
	}
	c := pod.Containers[0]
	if name := dep.Spec.Template.Annotations[defaultContainerAnnotation]; name != "" {
		for _, cc := range pod.Containers {
			if cc.Name == name {
				c = cc
			}
		}
	}
	s := &podSpec{
		hash:           hash,
		generation:     dep.Generation,
		replicas:       ptr.Deref(dep.Spec.Replicas, 1),
		strategy:       dep.Spec.Strategy.Type,
		namespace:      dep.Namespace,
		container:      c.Name,
		image:          c.Image,
		args:           append([]string(nil), c.Args...),
		serviceAccount: pod.ServiceAccountName,
	}
	if s.strategy == "" {
		s.strategy = appsv1.RollingUpdateDeploymentStrategyType
	}
	if s.serviceAccount == "" {
		s.serviceAccount = "default"
	}
	s.configPath = flagValue(c.Args, "config")
	if s.configPath == "" {
		return s, nil
	}
	if s.config, err = mountedFile(ctx, cs, dep.Namespace, &pod, &c, s.configPath); err != nil {
		return nil, fmt.Errorf("deployment %s/%s, container %s: --config=%s: %w", dep.Namespace, dep.Name, c.Name, s.configPath, err)
	}
	return s, nil
}

// flagValue returns the value of --name=value or --name value in args, "" when absent.
func flagValue(args []string, name string) string {
	for i, a := range args {
		trimmed := strings.TrimLeft(a, "-")
		if !strings.HasPrefix(a, "-") {
			continue
		}
		if v, ok := strings.CutPrefix(trimmed, name+"="); ok {
			return v
		}
		if trimmed == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// mountedFile returns the content of the file at file in container c, which must come from a
// ConfigMap volume: mounted with a subPath at exactly that path, or as a directory above it.
func mountedFile(ctx context.Context, cs kubernetes.Interface, namespace string, pod *corev1.PodSpec, c *corev1.Container, file string) ([]byte, error) {
	for _, m := range c.VolumeMounts {
		var key string
		switch {
		case m.SubPath != "" && path.Clean(m.MountPath) == path.Clean(file):
			key = m.SubPath
		case m.SubPath == "" && path.Dir(path.Clean(file)) == path.Clean(m.MountPath):
			key = path.Base(file)
		default:
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.ConfigMap == nil {
				return nil, fmt.Errorf("volume %s is not a ConfigMap", v.Name)
			}
			// A volume with items maps keys to paths; without, each key is a file.
			for _, it := range v.ConfigMap.Items {
				if it.Path == key {
					key = it.Key
				}
			}
			cm, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", namespace, v.ConfigMap.Name, err)
			}
			data, ok := cm.Data[key]
			if !ok {
				return nil, fmt.Errorf("ConfigMap %s/%s has no key %q", namespace, v.ConfigMap.Name, key)
			}
			return []byte(data), nil
		}
		return nil, fmt.Errorf("volume mount %s names no volume of the pod", m.Name)
	}
	return nil, fmt.Errorf("no volume is mounted at %s", file)
}

// serviceAccountKubeConfig returns a kubeconfig for the plane that authenticates as the
// ServiceAccount with a bound token, as the kubelet gives a pod, so that the manager runs with
// the permissions its chart grants it.
func serviceAccountKubeConfig(ctx context.Context, cs kubernetes.Interface, plane *controlplane.ControlPlane, namespace, name string) ([]byte, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second)),
	}}
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	server := plane.Config.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[plane.Name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: plane.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts[plane.Name] = &clientcmdapi.Context{Cluster: plane.Name, AuthInfo: name, Namespace: namespace}
	cfg.CurrentContext = plane.Name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("writing a kubeconfig for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return data, nil
}
