package install

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/charts"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	"github.com/flotilla-gitops/flotilla/test/componenttest"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/gobuild"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/podrunner"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// The names the README gives the user's world, which the test provides under the same names.
const (
	hubNamespace   = "flotilla-system"
	hubDeployment  = "flotilla-hub"
	agentNamespace = "flotilla-system"
	agentDeploy    = "flotilla-agent"
	tenant         = "acme"
	source         = "acme"
	cluster        = "gpu-east"
	botUser        = "flotilla-bot"
	hubImage       = "registry.acme.example/flotilla-hub"
	agentImage     = "registry.acme.example/flotilla-agent"
	// repoName is the repository on the forge, as https://git.acme.example/acme/fleet.git names it.
	repoName = "acme/fleet"
)

// world is the user's machine and clusters: the hub and worker planes with their pod
// runners and Kueue's kubelets, a forge (a git server with a bot account), the user's files,
// and a bash session whose PATH finds flotilla, helm, kubectl and age-keygen.
type world struct {
	t *testing.T
	// checkout is the session's working directory: the user's clone of this repository (its
	// charts/ links to the repository's), where the user's own files are; fleet is the
	// fleet repository's checkout beside it, ../acme-fleet.
	checkout, fleet, home string
	readme                string

	kueueVersion, kueueChart string
	tunnelAddr, httpAddr     string

	forgeToken string
	repoURL    string
	bare       string // the forge's repository on disk
	// merged is the merge commit of the pull request that enrolled the cluster.
	merged string
	notes  *gitnotes.Backend

	hubRunner, workerRunner   *podrunner.Runner
	hubKubelet, workerKubelet *componenttest.Kubelet
	// What the hub's and the agent's processes printed, and what the pod runners, the
	// components' kubelets and the Kueue and JobSet managers did.
	hubOut, workerOut, harnessOut *logtest.Buffer
	transcript                    string
	shell                         *shell
}

func newWorld(t *testing.T) *world {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w := &world{t: t, checkout: filepath.Join(dir, "flotilla"), fleet: filepath.Join(dir, "acme-fleet"), home: filepath.Join(dir, "home"),
		readme: filepath.Join(root, "README.md"), transcript: filepath.Join(dir, "session.log"),
		hubOut: &logtest.Buffer{}, workerOut: &logtest.Buffer{}, harnessOut: &logtest.Buffer{}}
	for _, d := range []string{w.checkout, w.home} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(root, "charts"), filepath.Join(w.checkout, "charts")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the session:\n%s", tail(readFile(w.transcript), 32<<10))
			t.Logf("the hub's pods:\n%s", w.hubOut.Last(32<<10))
			t.Logf("the agent's pod:\n%s", w.workerOut.Last(32<<10))
			t.Logf("the pod runners, the components' kubelets and their managers:\n%s", w.harnessOut.Last(16<<10))
		}
	})

	bin := w.tools(root, filepath.Join(dir, "bin"))
	w.kueueChartFile(dir)
	w.forge()
	w.userFiles()
	sessionKubeconfig := w.kubeconfig(filepath.Join(dir, "kubeconfig"))
	hubBin, agentBin := w.flotilla(filepath.Join(dir, "built"), bin)

	// The hub cluster: the hub's Deployment played by the pod runner, Kueue's by the
	// components' kubelet; the worker: the agent's, and Kueue's and JobSet's.
	w.hubRunner = w.startRunner(planes[0], hubNamespace, hubDeployment, hubImage, hubBin, w.hubOut)
	w.workerRunner = w.startRunner(planes[1], agentNamespace, agentDeploy, agentImage, agentBin, w.workerOut)
	w.hubKubelet = w.startKubelet(planes[0], map[componenttest.Component]types.NamespacedName{
		componenttest.Kueue: componenttest.DefaultDeployments()[componenttest.Kueue]})
	w.workerKubelet = w.startKubelet(planes[1], nil)
	if w.tunnelAddr, err = w.hubRunner.ServiceAddr(hubNamespace, hubDeployment+"-tunnel", 443); err != nil {
		t.Fatal(err)
	}
	if w.httpAddr, err = w.hubRunner.ServiceAddr(hubNamespace, hubDeployment+"-http", 80); err != nil {
		t.Fatal(err)
	}
	w.hubCertificate()

	w.shell = startShell(t, w.checkout, []string{
		"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HOME=" + w.home,
		"KUBECONFIG=" + sessionKubeconfig,
		"LC_ALL=C",
	}, w.transcript)
	return w
}

// tools puts the commands the README runs into dir, the first entry of the session's PATH:
// helm, kubectl and age-keygen from test/testbin (built from the module proxy, cached).
func (w *world) tools(root, dir string) string {
	t := w.t
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []struct{ env, script, name string }{
		{"FLOTILLA_HELM", "helm.sh", "helm"},
		{"FLOTILLA_KUBECTL", "kubectl.sh", "kubectl"},
		{"FLOTILLA_AGE_KEYGEN", "age-keygen.sh", "age-keygen"},
	} {
		d, err := controlplane.BinaryDir(t.Context(), tool.env, tool.script, tool.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(d, tool.name), filepath.Join(dir, tool.name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// flotilla builds flotilla's commands from this repository into dir, links the CLI into
// bin, and returns the hub's and the agent's binaries. The agent's installer,
// flotilla-components, lies beside the agent, as in its image.
func (w *world) flotilla(dir, bin string) (hub, agent string) {
	t := w.t
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &gobuild.Cache{Dir: dir, Race: raceEnabled}
	if err := os.Symlink(c.Binary(t, "flotilla"), filepath.Join(bin, "flotilla")); err != nil {
		t.Fatal(err)
	}
	c.Binary(t, components.BinaryName)
	return c.Binary(t, "flotilla-hub"), c.Binary(t, "flotilla-agent")
}

// kueueChartFile writes the Kueue chart this release embeds, which stands for the
// README's OCI reference: the one version the agent installs on workers too.
func (w *world) kueueChartFile(dir string) {
	t := w.t
	versions := charts.Versions(components.Kueue)
	if len(versions) != 1 {
		t.Fatalf("this build embeds Kueue charts %v; the README installs one", versions)
	}
	w.kueueVersion = versions[0]
	data, err := charts.Archive(components.Kueue, w.kueueVersion)
	if err != nil {
		t.Fatal(err)
	}
	w.kueueChart = filepath.Join(dir, "kueue-"+w.kueueVersion+".tgz")
	if err := os.WriteFile(w.kueueChart, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// forge starts the git server with the bot account the hub and the user push as, and
// creates the empty repository, as the user does on the forge before anything else.
func (w *world) forge() {
	t := w.t
	w.forgeToken = randomHex(t, 20)
	srv := gitserver.StartWithAuth(t, botUser, w.forgeToken)
	w.bare = srv.Path(repoName)
	git(t, w.home, "", "init", "-q", "--bare", "-b", "main", w.bare)
	w.repoURL = srv.URL(repoName)
	var err error
	w.notes, err = gitnotes.New(gitnotes.Options{URL: w.repoURL, Auth: &githttp.BasicAuth{Username: botUser, Password: w.forgeToken}})
	if err != nil {
		t.Fatal(err)
	}
}

// userFiles writes what the user brings: the forge token, and a git configuration with
// their name and their credentials for the forge.
func (w *world) userFiles() {
	t := w.t
	writeFile(t, filepath.Join(w.checkout, "forge-token"), []byte(w.forgeToken+"\n"), 0o600)
	u, err := url.Parse(w.repoURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(botUser, w.forgeToken)
	u.Path = ""
	writeFile(t, filepath.Join(w.home, ".git-credentials"), []byte(u.String()+"\n"), 0o600)
	writeFile(t, filepath.Join(w.home, ".gitconfig"), []byte("[user]\n\tname = Acme Platform\n\temail = platform@acme.example\n[credential]\n\thelper = store\n"), 0o600)
}

// hubCertificate writes the tunnel's certificate as the user's CA would issue it for
// hub.acme.example, here also for the loopback address that plays it (hub.crt, hub.key),
// and that CA (hub-ca.crt).
func (w *world) hubCertificate() {
	t := w.t
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Acme test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(crand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(w.tunnelAddr)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "hub.acme.example"},
		DNSNames: []string{"hub.acme.example"}, IPAddresses: []net.IP{net.ParseIP(host)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(crand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(w.checkout, "hub-ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644)
	writeFile(t, filepath.Join(w.checkout, "hub.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	writeFile(t, filepath.Join(w.checkout, "hub.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}

// kubeconfig writes the user's kubeconfig, with the contexts the README names: hub and
// gpu-east, as the planes' administrators.
func (w *world) kubeconfig(file string) string {
	t := w.t
	out := clientcmdapi.NewConfig()
	for i, name := range []string{"hub", cluster} {
		cfg, err := clientcmd.Load(planes[i].KubeConfig)
		if err != nil {
			t.Fatal(err)
		}
		ctx := cfg.Contexts[cfg.CurrentContext]
		if ctx == nil {
			t.Fatalf("plane %s's kubeconfig has no current context", planes[i].Name)
		}
		out.Clusters[name] = cfg.Clusters[ctx.Cluster]
		out.AuthInfos[name] = cfg.AuthInfos[ctx.AuthInfo]
		out.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	}
	out.CurrentContext = "hub"
	if err := clientcmd.WriteToFile(*out, file); err != nil {
		t.Fatal(err)
	}
	return file
}

// startRunner plays a chart's Deployment on plane with the binary built from this
// repository for its image.
func (w *world) startRunner(plane *controlplane.ControlPlane, namespace, name, image, binary string, out io.Writer) *podrunner.Runner {
	t := w.t
	r, err := podrunner.Start(t.Context(), plane, podrunner.Options{
		Deployments: []types.NamespacedName{{Namespace: namespace, Name: name}},
		Images:      map[string]string{image: binary},
		Output:      out,
		Log:         w.harnessLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// startKubelet runs the real Kueue (and JobSet) managers behind their charts' Deployments.
func (w *world) startKubelet(plane *controlplane.ControlPlane, deployments map[componenttest.Component]types.NamespacedName) *componenttest.Kubelet {
	t := w.t
	k, err := componenttest.Start(t.Context(), plane, componenttest.Options{Deployments: deployments, Output: w.harnessOut, Log: w.harnessLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Stop(); err != nil {
			t.Error(err)
		}
	})
	return k
}

func (w *world) harnessLogger() *slog.Logger { return w.harnessOut.Logger() }

// openPullRequest does what the forge does when a pull request from branch is opened: it
// publishes the branch's head as refs/pull/N/head and sends the pull_request webhook. It
// returns the head.
func (w *world) openPullRequest(number int, branch string) string {
	t := w.t
	git(t, w.home, w.bare, "update-ref", fmt.Sprintf("refs/pull/%d/head", number), "refs/heads/"+branch)
	head := strings.TrimSpace(git(t, w.home, w.bare, "rev-parse", "refs/heads/"+branch))
	w.webhook("pull_request", fmt.Sprintf(`{"action":"opened","number":%d,"pull_request":{"head":{"sha":%q,"ref":%q},"base":{"ref":"main"}}}`, number, head, branch))
	return head
}

// mergePullRequest does what the forge's merge button does: a merge commit of branch into
// main, made in the forge's own storage, and the push webhook. It returns the merge commit.
func (w *world) mergePullRequest(number int, branch string) string {
	t := w.t
	clone := filepath.Join(t.TempDir(), "merge")
	git(t, w.home, "", "clone", "-q", w.bare, clone)
	git(t, w.home, clone, "merge", "-q", "--no-ff", "-m", fmt.Sprintf("Merge pull request #%d from %s", number, branch), "origin/"+branch)
	git(t, w.home, clone, "push", "-q", "origin", "main")
	merged := strings.TrimSpace(git(t, w.home, clone, "rev-parse", "HEAD"))
	w.webhook("push", fmt.Sprintf(`{"ref":"refs/heads/main","after":%q}`, merged))
	return merged
}

// webhook delivers an event as GitHub signs it, with the secret the README generated, to
// the hub's HTTP Service (which the Ingress would reach), and fails the test unless the hub
// accepts it.
func (w *world) webhook(event, body string) {
	t := w.t
	secret := strings.TrimSpace(readFile(filepath.Join(w.checkout, "webhook-secret")))
	if secret == "" {
		t.Fatal("the README's webhook-secret is empty")
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(body))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+w.httpAddr+"/webhooks/"+source, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", event)
	req.Header.Set("X-GitHub-Delivery", randomHex(t, 16))
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("delivering the %s webhook: %v", event, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("the hub answered the %s webhook %d: %s", event, resp.StatusCode, b)
	}
}

// waitStatus waits for commit's status of context to be want, as the hub recorded it in the
// fleet repository's notes, and returns it.
func (w *world) waitStatus(commit, context string, want commitstatus.State, contains string) commitstatus.Status {
	t := w.t
	t.Helper()
	var st commitstatus.Status
	poll.Until(t, fmt.Sprintf("%.8s: %s %s %q", commit, context, want, contains), func() (bool, string) {
		got, err := w.notes.Latest(t.Context(), commit)
		if err != nil {
			return false, err.Error()
		}
		st = got[context]
		return st.State == want && strings.Contains(st.Description, contains), fmt.Sprintf("%s: %s", st.State, st.Description)
	})
	return st
}

// git runs git as the user, with their configuration in home, in dir (none: the
// session's), and returns its output.
func git(t *testing.T, home, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "LC_ALL=C", "GIT_TERMINAL_PROMPT=0"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

func readFile(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := crand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
