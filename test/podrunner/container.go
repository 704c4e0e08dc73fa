package podrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// tokenLifetime is how long the token of a process's kubeconfig is valid: longer than any
// test, since the Runner does not refresh it as the kubelet would.
const tokenLifetime = 24 * time.Hour

// configError is a container that cannot start before its process runs, with the reason the
// kubelet would give it (ErrImagePull, CreateContainerConfigError, ...).
type configError struct {
	reason string
	err    error
}

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

func configErr(reason, format string, args ...any) error {
	return &configError{reason: reason, err: fmt.Errorf(format, args...)}
}

// containerSpec is what a process of the container runs with, resolved once per Pod.
type containerSpec struct {
	binary    string
	args      []string
	env       []string
	readiness *corev1.Probe
}

// prepare resolves what the container's process needs: the binary for its image, a
// loopback port for each container port, its volumes written to directories, its
// environment, and its arguments and configuration files rewritten for this machine.
func (p *pod) prepare(ctx context.Context, log *slog.Logger) (*containerSpec, error) {
	c := p.container
	if len(c.Command) > 0 {
		// The image's entrypoint is the binary the Runner maps it to; a command would name
		// a path inside an image that is not there.
		return nil, configErr("CreateContainerConfigError", "container %s: a command override (%q) cannot be played, only the image's entrypoint", c.Name, c.Command)
	}
	binary, ok := p.r.opts.Images[imageRepository(c.Image)]
	if !ok {
		return nil, configErr("ErrImagePull", "image %q: no binary plays repository %s", c.Image, imageRepository(c.Image))
	}

	ports, names := map[int32]string{}, map[string]int32{}
	for _, cp := range c.Ports {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		ports[cp.ContainerPort] = addr
		if cp.Name != "" {
			names[cp.Name] = cp.ContainerPort
		}
	}
	p.mu.Lock()
	p.ports, p.names = ports, names
	p.mu.Unlock()

	volumes, err := p.materialize(ctx)
	if err != nil {
		return nil, err
	}
	w := &rewriter{ports: ports, service: p.r.ServiceAddr}
	for _, m := range c.VolumeMounts {
		dir, ok := volumes[m.Name]
		if !ok {
			return nil, configErr("CreateContainerConfigError", "volume mount %s names no volume of the pod", m.Name)
		}
		w.mounts = append(w.mounts, mount{path: path.Clean(m.MountPath), host: filepath.Join(dir, filepath.FromSlash(m.SubPath))})
	}
	// The longest mount path first, so that a mount inside another one wins.
	slices.SortFunc(w.mounts, func(a, b mount) int { return len(b.path) - len(a.path) })

	env, err := p.environment(ctx, w)
	if err != nil {
		return nil, err
	}
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = w.arg(expandVars(a, env))
	}
	// The files the arguments name are the process's configuration: rewritten in the
	// Runner's copy, as the arguments were.
	for _, a := range args {
		if err := w.rewriteFile(flagValue(a)); err != nil {
			return nil, configErr("CreateContainerConfigError", "rewriting %s: %w", flagValue(a), err)
		}
	}

	home, tmp := filepath.Join(p.dir, "home"), filepath.Join(p.dir, "tmp")
	for _, d := range []string{home, tmp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	procEnv := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TMPDIR=" + tmp}
	if automount(p.obj) {
		kc, err := p.kubeconfig(ctx)
		if err != nil {
			return nil, err
		}
		procEnv = append(procEnv, "KUBECONFIG="+kc)
	}
	for _, e := range env {
		procEnv = append(procEnv, e.name+"="+e.value)
	}
	procEnv = append(procEnv, p.r.opts.Env...)
	for _, ch := range w.changes {
		log.Info("rewritten for this machine", "from", ch[0], "to", ch[1])
	}
	return &containerSpec{binary: binary, args: args, env: procEnv, readiness: c.ReadinessProbe}, nil
}

// imageRepository is an image reference without its tag or digest.
func imageRepository(image string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		image = image[:i]
	}
	return image
}

// freeLoopbackAddr is a port on 127.0.0.1 that nothing listens on now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// flagValue is the value of an argument --name=value, or the argument itself.
func flagValue(a string) string {
	if strings.HasPrefix(a, "-") {
		if _, v, ok := strings.Cut(a, "="); ok {
			return v
		}
	}
	return a
}

// automount reports whether the Pod gets its ServiceAccount's credentials.
func automount(p *corev1.Pod) bool {
	return ptr.Deref(p.Spec.AutomountServiceAccountToken, true)
}

// kubeconfig writes a kubeconfig that authenticates as the Pod's ServiceAccount with a
// token bound to the Pod, and returns its path.
func (p *pod) kubeconfig(ctx context.Context) (string, error) {
	sa := p.obj.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tok, err := p.token(ctx, sa, nil, int64(tokenLifetime/time.Second))
	if err != nil {
		return "", err
	}
	plane := p.r.plane
	server := plane.Config.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[plane.Name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: plane.Config.CAData}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tok}
	cfg.Contexts[plane.Name] = &clientcmdapi.Context{Cluster: plane.Name, AuthInfo: sa, Namespace: p.key.Namespace}
	cfg.CurrentContext = plane.Name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return "", fmt.Errorf("writing a kubeconfig for ServiceAccount %s/%s: %w", p.key.Namespace, sa, err)
	}
	file := filepath.Join(p.dir, "kubeconfig")
	// It holds a token: readable by this user only.
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return "", err
	}
	return file, nil
}

// token requests a token of ServiceAccount sa bound to the Pod, as the kubelet does for
// the Pod's projected tokens: it stops working once the Pod is deleted.
func (p *pod) token(ctx context.Context, sa string, audiences []string, seconds int64) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         audiences,
		ExpirationSeconds: ptr.To(seconds),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.obj.Name, UID: p.obj.UID},
	}}
	tok, err := p.r.cs.CoreV1().ServiceAccounts(p.key.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", configErr("CreateContainerConfigError", "requesting a token for ServiceAccount %s/%s: %w", p.key.Namespace, sa, err)
	}
	return tok.Status.Token, nil
}

// envVar is one variable of the container's environment.
type envVar struct{ name, value string }

// environment resolves the container's env and envFrom as the kubelet does. Literal values
// are rewritten like the arguments; values from Secrets are passed as they are.
func (p *pod) environment(ctx context.Context, w *rewriter) ([]envVar, error) {
	c := p.container
	var out []envVar
	for _, from := range c.EnvFrom {
		var data map[string]string
		var optional bool
		switch {
		case from.ConfigMapRef != nil:
			optional = ptr.Deref(from.ConfigMapRef.Optional, false)
			d, err := p.configMapData(ctx, from.ConfigMapRef.Name, optional)
			if err != nil {
				return nil, err
			}
			data = d
		case from.SecretRef != nil:
			optional = ptr.Deref(from.SecretRef.Optional, false)
			d, err := p.secretData(ctx, from.SecretRef.Name, optional)
			if err != nil {
				return nil, err
			}
			data = map[string]string{}
			for k, v := range d {
				data[k] = string(v)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			out = append(out, envVar{from.Prefix + k, data[k]})
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			out = append(out, envVar{e.Name, w.str(expandVars(e.Value, out))})
			continue
		}
		v, err := p.valueFrom(ctx, e.ValueFrom)
		if err != nil {
			return nil, configErr("CreateContainerConfigError", "env %s: %w", e.Name, err)
		}
		out = append(out, envVar{e.Name, v})
	}
	return out, nil
}

func (p *pod) valueFrom(ctx context.Context, from *corev1.EnvVarSource) (string, error) {
	switch {
	case from.FieldRef != nil:
		return p.field(from.FieldRef.FieldPath)
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		data, err := p.configMapData(ctx, ref.Name, ptr.Deref(ref.Optional, false))
		if err != nil {
			return "", err
		}
		return data[ref.Key], nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		data, err := p.secretData(ctx, ref.Name, ptr.Deref(ref.Optional, false))
		if err != nil {
			return "", err
		}
		return string(data[ref.Key]), nil
	}
	return "", errors.New("only fieldRef, configMapKeyRef and secretKeyRef can be played")
}

var fieldSubscript = regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`)

// field is the downward API's value of path for the Pod.
func (p *pod) field(fieldPath string) (string, error) {
	o := p.obj
	switch fieldPath {
	case "metadata.name":
		return o.Name, nil
	case "metadata.namespace":
		return o.Namespace, nil
	case "metadata.uid":
		return string(o.UID), nil
	case "spec.nodeName":
		return o.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return o.Spec.ServiceAccountName, nil
	case "status.podIP", "status.hostIP", "status.podIPs", "status.hostIPs":
		return "127.0.0.1", nil
	}
	if m := fieldSubscript.FindStringSubmatch(fieldPath); m != nil {
		if m[1] == "labels" {
			return o.Labels[m[2]], nil
		}
		return o.Annotations[m[2]], nil
	}
	return "", fmt.Errorf("field %s cannot be played", fieldPath)
}

// expandVars expands $(NAME) references to the variables of env, as the kubelet does in a
// container's command, arguments and env values; $$ is a literal $, an unknown name stays.
func expandVars(s string, env []envVar) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if end := strings.IndexByte(s[i:], ')'); end > 0 {
				name := s[i+2 : i+end]
				if v, ok := lookup(env, name); ok {
					b.WriteString(v)
					i += end
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func lookup(env []envVar, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if env[i].name == name {
			return env[i].value, true
		}
	}
	return "", false
}
