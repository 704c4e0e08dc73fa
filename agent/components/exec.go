package components

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// BinaryName is the installer's executable, shipped beside the agent's. It links Helm,
// which the long-running agent does not: it runs only while components change.
const BinaryName = "flotilla-components"

// maxReport bounds what the agent reads of the installer's answer.
const maxReport = 1 << 20

// Installer runs the installer binary for the agent.
type Installer struct {
	// Binary is the installer's path.
	Binary string
	// KubeConfig is the worker's kubeconfig handed to the installer on its standard
	// input; nil lets it use its in-cluster configuration, as the agent does.
	KubeConfig []byte
	// Stderr receives the installer's log; nil discards it.
	Stderr io.Writer
	// Images is the worker's policy, handed to the installer with each request: it
	// checks the images again where it writes them (see package installer).
	Images ImagePolicy
}

// BesideExecutable is the installer next to the running executable, where the agent's
// image and release archives put it.
func BesideExecutable() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("locating %s: %w", BinaryName, err)
	}
	return filepath.Join(filepath.Dir(self), BinaryName), nil
}

// Apply installs or upgrades the components spec names, in order.
func (i *Installer) Apply(ctx context.Context, spec Spec) (Report, error) {
	return i.run(ctx, []string{"apply"}, Request{Spec: spec, Images: i.Images, KubeConfig: i.KubeConfig})
}

// Uninstall removes the Helm releases flotilla installed; a dry run lists what it would
// remove.
func (i *Installer) Uninstall(ctx context.Context, dryRun bool) (Report, error) {
	args := []string{"uninstall"}
	if dryRun {
		args = append(args, "--dry-run")
	}
	return i.run(ctx, args, Request{KubeConfig: i.KubeConfig, DryRun: dryRun})
}

func (i *Installer) run(ctx context.Context, args []string, req Request) (Report, error) {
	in, err := json.Marshal(req)
	if err != nil {
		return Report{}, err
	}
	var out bytes.Buffer
	tail := &tailWriter{max: 4 << 10}
	cmd := exec.CommandContext(ctx, i.Binary, args...)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stdout = &limitedWriter{w: &out, n: maxReport}
	cmd.Stderr = tail
	if i.Stderr != nil {
		cmd.Stderr = io.MultiWriter(i.Stderr, tail)
	}
	// The environment is the agent's, for KUBERNETES_SERVICE_HOST and proxies; the
	// kubeconfig travels on stdin only.
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(tail.buf) > 0 {
			return Report{}, fmt.Errorf("%s %s: %w: %s", BinaryName, args[0], err, bytes.TrimSpace(tail.buf))
		}
		return Report{}, fmt.Errorf("%s %s: %w", BinaryName, args[0], err)
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return Report{}, fmt.Errorf("%s %s: reading its report: %w", BinaryName, args[0], err)
	}
	return rep, nil
}

// KubeConfigFor writes cfg as a kubeconfig with its credentials inline, for a process
// that must reach the same API server as the agent, as the same identity.
func KubeConfigFor(cfg *rest.Config) ([]byte, error) {
	if cfg.ExecProvider != nil || cfg.AuthProvider != nil {
		return nil, errors.New("the worker's kubeconfig authenticates with a plugin, which the installer does not run; use a token or a client certificate")
	}
	cluster := &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile, InsecureSkipTLSVerify: cfg.Insecure, TLSServerName: cfg.ServerName}
	auth := &clientcmdapi.AuthInfo{Token: cfg.BearerToken, TokenFile: cfg.BearerTokenFile, ClientCertificateData: cfg.CertData, ClientCertificate: cfg.CertFile,
		ClientKeyData: cfg.KeyData, ClientKey: cfg.KeyFile, Username: cfg.Username, Password: cfg.Password, Impersonate: cfg.Impersonate.UserName}
	kc := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"worker": cluster},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"agent": auth},
		Contexts:       map[string]*clientcmdapi.Context{"worker": {Cluster: "worker", AuthInfo: "agent"}},
		CurrentContext: "worker",
	}
	return clientcmd.Write(kc)
}

// tailWriter keeps the last max bytes written, for the error of a failed run.
type tailWriter struct {
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

// limitedWriter takes at most n bytes and fails past them, which fails the run.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if len(p) > l.n {
		return 0, fmt.Errorf("the report is larger than %d bytes", maxReport)
	}
	l.n -= len(p)
	return l.w.Write(p)
}
