package podrunner

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// defaultFileMode is a volume file's mode when the volume gives none, as Kubernetes'.
const defaultFileMode = 0o644

// materialize writes every volume of the Pod into a directory of its own under the Pod's
// directory, as the kubelet mounts them, and returns the directories by volume name.
func (p *pod) materialize(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	for _, v := range p.obj.Spec.Volumes {
		dir := filepath.Join(p.dir, "volumes", v.Name)
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := p.volume(ctx, v, dir); err != nil {
			return nil, configErr("CreateContainerConfigError", "volume %s: %w", v.Name, err)
		}
		out[v.Name] = dir
	}
	return out, nil
}

func (p *pod) volume(ctx context.Context, v corev1.Volume, dir string) error {
	switch {
	case v.EmptyDir != nil:
		return nil
	case v.ConfigMap != nil:
		return p.configMapFiles(ctx, dir, v.ConfigMap.Name, v.ConfigMap.Items, ptr.Deref(v.ConfigMap.Optional, false), v.ConfigMap.DefaultMode)
	case v.Secret != nil:
		return p.secretFiles(ctx, dir, v.Secret.SecretName, v.Secret.Items, ptr.Deref(v.Secret.Optional, false), v.Secret.DefaultMode)
	case v.DownwardAPI != nil:
		return p.downwardFiles(dir, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
	case v.Projected != nil:
		for _, s := range v.Projected.Sources {
			var err error
			switch {
			case s.ConfigMap != nil:
				err = p.configMapFiles(ctx, dir, s.ConfigMap.Name, s.ConfigMap.Items, ptr.Deref(s.ConfigMap.Optional, false), v.Projected.DefaultMode)
			case s.Secret != nil:
				err = p.secretFiles(ctx, dir, s.Secret.Name, s.Secret.Items, ptr.Deref(s.Secret.Optional, false), v.Projected.DefaultMode)
			case s.DownwardAPI != nil:
				err = p.downwardFiles(dir, s.DownwardAPI.Items, v.Projected.DefaultMode)
			case s.ServiceAccountToken != nil:
				err = p.tokenFile(ctx, dir, s.ServiceAccountToken, v.Projected.DefaultMode)
			default:
				err = fmt.Errorf("a projected source other than configMap, secret, downwardAPI and serviceAccountToken cannot be played")
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("only emptyDir, configMap, secret, downwardAPI and projected volumes can be played")
}

func (p *pod) configMapData(ctx context.Context, name string, optional bool) (map[string]string, error) {
	cm, err := p.r.cs.CoreV1().ConfigMaps(p.key.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && optional {
		return nil, nil
	}
	if err != nil {
		return nil, configErr("CreateContainerConfigError", "reading ConfigMap %s/%s: %w", p.key.Namespace, name, err)
	}
	data := maps.Clone(cm.Data)
	if data == nil {
		data = map[string]string{}
	}
	for k, v := range cm.BinaryData {
		data[k] = string(v)
	}
	return data, nil
}

func (p *pod) secretData(ctx context.Context, name string, optional bool) (map[string][]byte, error) {
	s, err := p.r.cs.CoreV1().Secrets(p.key.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && optional {
		return nil, nil
	}
	if err != nil {
		return nil, configErr("CreateContainerConfigError", "reading Secret %s/%s: %w", p.key.Namespace, name, err)
	}
	return s.Data, nil
}

func (p *pod) configMapFiles(ctx context.Context, dir, name string, items []corev1.KeyToPath, optional bool, mode *int32) error {
	data, err := p.configMapData(ctx, name, optional)
	if err != nil {
		return err
	}
	bytes := map[string][]byte{}
	for k, v := range data {
		bytes[k] = []byte(v)
	}
	return writeKeys(dir, "ConfigMap "+name, bytes, items, optional, mode)
}

func (p *pod) secretFiles(ctx context.Context, dir, name string, items []corev1.KeyToPath, optional bool, mode *int32) error {
	data, err := p.secretData(ctx, name, optional)
	if err != nil {
		return err
	}
	return writeKeys(dir, "Secret "+name, data, items, optional, mode)
}

// writeKeys writes data into dir: every key as a file of its name, or, with items, the
// items' keys at their paths. A key an item names and data lacks fails unless optional.
func writeKeys(dir, what string, data map[string][]byte, items []corev1.KeyToPath, optional bool, mode *int32) error {
	if data == nil && optional {
		return nil
	}
	if len(items) == 0 {
		for _, k := range slices.Sorted(maps.Keys(data)) {
			if err := writeFile(dir, k, data[k], mode); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return fmt.Errorf("%s has no key %q", what, it.Key)
		}
		m := mode
		if it.Mode != nil {
			m = it.Mode
		}
		if err := writeFile(dir, it.Path, v, m); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(dir, rel string, data []byte, mode *int32) error {
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if !filepath.IsLocal(filepath.FromSlash(rel)) {
		return fmt.Errorf("path %q leaves the volume", rel)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	perm := fs.FileMode(defaultFileMode)
	if mode != nil {
		perm = fs.FileMode(*mode) & fs.ModePerm
	}
	if err := os.WriteFile(p, data, perm); err != nil {
		return err
	}
	// WriteFile keeps the mode of a file that exists; a projected volume's sources write
	// each file once.
	return os.Chmod(p, perm)
}

func (p *pod) downwardFiles(dir string, items []corev1.DownwardAPIVolumeFile, mode *int32) error {
	for _, it := range items {
		if it.FieldRef == nil {
			return fmt.Errorf("downward API file %s: only fieldRef can be played", it.Path)
		}
		v, err := p.field(it.FieldRef.FieldPath)
		if err != nil {
			return err
		}
		m := mode
		if it.Mode != nil {
			m = it.Mode
		}
		if err := writeFile(dir, it.Path, []byte(v), m); err != nil {
			return err
		}
	}
	return nil
}

// tokenFile writes a projected ServiceAccount token, bound to the Pod. It is not refreshed:
// the lifetime asked for is at least an hour, longer than a test.
func (p *pod) tokenFile(ctx context.Context, dir string, src *corev1.ServiceAccountTokenProjection, mode *int32) error {
	sa := p.obj.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	var audiences []string
	if src.Audience != "" {
		audiences = []string{src.Audience}
	}
	tok, err := p.token(ctx, sa, audiences, ptr.Deref(src.ExpirationSeconds, 3600))
	if err != nil {
		return err
	}
	return writeFile(dir, src.Path, []byte(tok), mode)
}
