package main

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

// hubRepo is a fleet repository made by `fleet init`, with the hub's key file beside it.
type hubRepo struct {
	dir, keyFile string
	dec          *secrets.Decryptor
}

func newHubRepo(t *testing.T) hubRepo {
	t.Helper()
	// SOPS must not find keys anywhere but where the hub holds them.
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	hub := sopstest.NewIdentity(t)
	keys := t.TempDir()
	dir := filepath.Join(t.TempDir(), "fleet")
	code, out, errOut := runCLI(t, "fleet", "init", dir, "--tenant", "acme", "--hub-url", "wss://hub.acme.test", "--age-recipient", hub.Recipient().String())
	if code != 0 {
		t.Fatalf("fleet init: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, `Created fleet repository`) {
		t.Fatalf("fleet init said %q", out)
	}
	ids, err := secrets.NewIdentities(hub)
	if err != nil {
		t.Fatal(err)
	}
	return hubRepo{dir: dir, keyFile: sopstest.WriteKeyFile(t, keys, "hub.agekey", hub), dec: secrets.NewDecryptor(secrets.DecryptorOptions{Identities: ids})}
}

func (r hubRepo) add(t *testing.T, name string, extra ...string) string {
	t.Helper()
	args := append([]string{"cluster", "add", name, "--dir", r.dir, "--region", "us-east1", "--zone", "us-east1-b", "--residency", "us", "--preset", "gke-dws"}, extra...)
	code, out, errOut := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("cluster add %s: exit %d: %s", name, code, errOut)
	}
	return out
}

// valuesToken reads the token from the agent's values file.
func (r hubRepo) valuesToken(t *testing.T, name string) secrets.Token {
	t.Helper()
	p := filepath.Join(r.dir, "values."+name+".local.yaml")
	info, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("%s has mode %v, want 0600", p, info.Mode().Perm())
	}
	data, _ := os.ReadFile(p)
	m := regexp.MustCompile(`(?m)^  token: (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("values file has no enrollment.token")
	}
	tok, err := secrets.ParseToken(string(m[1]))
	if err != nil {
		t.Fatalf("values file token: %v", err)
	}
	return tok
}

// enrollmentHash decrypts a cluster's enrollment file the way the hub does.
func (r hubRepo) enrollmentHash(t *testing.T, name string) secrets.Hash {
	t.Helper()
	rel := "clusters/" + name + "/enrollment.sops.yaml"
	data, err := os.ReadFile(filepath.Join(r.dir, rel))
	if err != nil {
		t.Fatal(err)
	}
	h, err := r.dec.TokenHash(t.Context(), rel, data)
	if err != nil {
		t.Fatalf("the hub cannot decrypt %s: %v", rel, err)
	}
	return h
}

func TestFleetInitAndClusterAddMakeARepositoryTheHubCanRead(t *testing.T) {
	r := newHubRepo(t)
	out := r.add(t, "gpu-east", "--gpus", "16", "--cordoned")
	tok := r.valuesToken(t, "gpu-east")

	if strings.Contains(out, tok.Reveal()) {
		t.Fatal("cluster add printed the token")
	}
	for _, want := range []string{"git add clusters/gpu-east", "values.gpu-east.local.yaml", "identity 4-acme-gpu-east", tok.Hash().Fingerprint()} {
		if !strings.Contains(out, want) {
			t.Errorf("cluster add's instructions lack %q:\n%s", want, out)
		}
	}
	if !r.enrollmentHash(t, "gpu-east").Equal(tok.Hash()) {
		t.Fatal("the hub's hash of the enrollment file is not the hash of the values file's token")
	}

	f := fleet.Load(fleet.DirFS(r.dir))
	c := f.Clusters["gpu-east"]
	if !f.Valid() || c == nil || !c.Valid() {
		t.Fatalf("the new repository does not load: %v", f.AllErrors())
	}
	if f.Spec.Spec.Tenant != "acme" || f.Spec.Spec.HubURL != "wss://hub.acme.test" {
		t.Errorf("fleet.yaml has tenant %q and hub %q", f.Spec.Spec.Tenant, f.Spec.Spec.HubURL)
	}
	spec := c.Object.Spec
	if spec.Region != "us-east1" || spec.Zone != "us-east1-b" || spec.Residency != "us" || spec.Preset != "gke-dws" || !spec.Cordoned || spec.Quota.Name("nvidia.com/gpu", "").Value() != 16 {
		t.Errorf("cluster.yaml spec is %+v", spec)
	}
	if _, ok := f.Clusters[fleetTemplateExample]; ok {
		t.Error("fleet init copied the template's example cluster, whose token no hub can decrypt")
	}
	values, _ := os.ReadFile(filepath.Join(r.dir, "values.gpu-east.local.yaml"))
	for _, want := range []string{"url: wss://hub.acme.test", "tenant: acme", "name: gpu-east", "identity: 4-acme-gpu-east"} {
		if !strings.Contains(string(values), want) {
			t.Errorf("the values file lacks %q", want)
		}
	}

	code, stdout, errOut := runCLI(t, "validate", r.dir, "--age-key", r.keyFile)
	if code != 0 || !strings.Contains(stdout, "every enrollment file decrypted") {
		t.Fatalf("validate --age-key: exit %d\n%s%s", code, stdout, errOut)
	}
}

const fleetTemplateExample = "example-us-central1"

// snapshot is every path under dir with a digest of its content and its mode.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		sum := ""
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum = fmt.Sprintf("%x", sha256.Sum256(data))
		}
		files[p] = info.Mode().String() + " " + sum
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestClusterAddRefusesAndChangesNothing(t *testing.T) {
	r := newHubRepo(t)
	r.add(t, "gpu-east")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T)
		args  []string
		msg   string
	}{
		{"an existing name", nil, []string{"gpu-east", "--preset", "gke-dws"}, "clusters/gpu-east already exists"},
		{"an invalid name", nil, []string{"GPU_West", "--preset", "gke-dws"}, `cluster name "GPU_West"`},
		{"a name too long for a DNS label", nil, []string{strings.Repeat("a", 64), "--preset", "gke-dws"}, "must be no more than 63 characters"},
		{"a preset that does not exist", nil, []string{"gpu-west", "--preset", "tpu"}, `--preset "tpu" does not exist under presets/ (have: gke-dws, gpu)`},
		{"a residency the fleet does not allow", nil, []string{"gpu-west", "--preset", "gke-dws", "--residency", "mars"}, `residency "mars" is not allowed`},
		{"a values file git would commit", func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(r.dir, ".gitignore"), []byte("# nothing ignored\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"gpu-west", "--preset", "gke-dws"}, "would not be ignored by git"},
		{"no creation rule for the file", func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(r.dir, ".sops.yaml"), []byte("creation_rules:\n  - path_regex: ^elsewhere/\n    age: "+sopstest.Recipients(sopstest.NewIdentity(t))+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"gpu-west", "--preset", "gke-dws"}, "no matching creation rules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				gitignore, _ := os.ReadFile(filepath.Join(r.dir, ".gitignore"))
				sopsConfig, _ := os.ReadFile(filepath.Join(r.dir, ".sops.yaml"))
				t.Cleanup(func() {
					os.WriteFile(filepath.Join(r.dir, ".gitignore"), gitignore, 0o644)
					os.WriteFile(filepath.Join(r.dir, ".sops.yaml"), sopsConfig, 0o644)
				})
				tc.setup(t)
			}
			before := snapshot(t, r.dir)
			args := append([]string{"cluster", "add", "--dir", r.dir, "--region", "us-west1", "--residency", "us"}, tc.args...)
			code, out, errOut := runCLI(t, args...)
			if code != 1 || out != "" || !strings.Contains(errOut, tc.msg) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, tc.msg)
			}
			after := snapshot(t, r.dir)
			for p, v := range after {
				if before[p] != v {
					t.Errorf("%s changed or appeared", p)
				}
			}
			for p := range before {
				if _, ok := after[p]; !ok {
					t.Errorf("%s disappeared", p)
				}
			}
		})
	}
}

func TestRotateTokenGivesANewTokenTheHubCanRead(t *testing.T) {
	r := newHubRepo(t)
	r.add(t, "gpu-east")
	old := r.valuesToken(t, "gpu-east")
	code, out, errOut := runCLI(t, "cluster", "rotate-token", "gpu-east", "--dir", r.dir)
	if code != 0 {
		t.Fatalf("rotate-token: exit %d: %s", code, errOut)
	}
	tok := r.valuesToken(t, "gpu-east")
	if tok.Hash().Equal(old.Hash()) {
		t.Fatal("rotate-token kept the old token")
	}
	if strings.Contains(out, tok.Reveal()) {
		t.Fatal("rotate-token printed the token")
	}
	if h := r.enrollmentHash(t, "gpu-east"); !h.Equal(tok.Hash()) {
		t.Fatal("the enrollment file does not hold the new token")
	}
	if code, _, errOut := runCLI(t, "cluster", "rotate-token", "gpu-west", "--dir", r.dir); code != 1 || !strings.Contains(errOut, `no cluster "gpu-west"`) {
		t.Fatalf("rotate-token of an unknown cluster: exit %d, %q", code, errOut)
	}
}

// --revoke raises the cluster's revocation counter, keeping every other byte of
// cluster.yaml, each time it is run; the hub then refuses the credentials issued before.
func TestRotateTokenRevokeRaisesTheRevocationCounter(t *testing.T) {
	r := newHubRepo(t)
	r.add(t, "gpu-east")
	file := filepath.Join(r.dir, "clusters", "gpu-east", "cluster.yaml")
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 2; want++ {
		old := r.valuesToken(t, "gpu-east")
		code, out, errOut := runCLI(t, "cluster", "rotate-token", "gpu-east", "--revoke", "--dir", r.dir)
		if code != 0 {
			t.Fatalf("rotate-token --revoke: exit %d: %s", code, errOut)
		}
		if tok := r.valuesToken(t, "gpu-east"); tok.Hash().Equal(old.Hash()) || !r.enrollmentHash(t, "gpu-east").Equal(tok.Hash()) {
			t.Fatal("rotate-token --revoke did not give the cluster a new token")
		}
		if !strings.Contains(out, fmt.Sprintf("spec.revocation to %d", want)) {
			t.Fatalf("the output does not say the new revocation %d:\n%s", want, out)
		}
		f, err := loadDir(r.dir)
		if err != nil {
			t.Fatal(err)
		}
		c := f.Clusters["gpu-east"]
		if c == nil || !c.Valid() {
			t.Fatalf("cluster gpu-east does not load after rotate-token --revoke: %v", c)
		}
		if c.Object.Spec.Revocation != int64(want) {
			t.Fatalf("after run %d cluster.yaml says revocation %d", want, c.Object.Spec.Revocation)
		}
	}
	after, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Only the one line was added: the rest of the file is as it was.
	added := strings.Replace(string(after), "  revocation: 2\n", "", 1)
	if added != string(before) {
		t.Fatalf("cluster.yaml changed beyond spec.revocation:\n%s", after)
	}
}

func TestValidateFailsOnAPlaintextTokenAnywhere(t *testing.T) {
	r := newHubRepo(t)
	r.add(t, "gpu-east")
	tok := r.valuesToken(t, "gpu-east")
	leak := filepath.Join(r.dir, "docs", "runbook.md")
	os.MkdirAll(filepath.Dir(leak), 0o755)
	if err := os.WriteFile(leak, []byte("# Runbook\n\nEnroll with `"+tok.Reveal()+"`.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "validate", r.dir)
	if code != 1 || out != "" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	if want := "docs/runbook.md:3:14: a plaintext enrollment token (fingerprint " + tok.Hash().Fingerprint() + ")"; !strings.Contains(errOut, want) {
		t.Errorf("stderr %q lacks %q", errOut, want)
	}
	if strings.Contains(errOut, tok.Reveal()) {
		t.Fatal("validate printed the leaked token")
	}
	if strings.Contains(errOut, "values.gpu-east.local.yaml") {
		t.Error("validate reported the git-ignored values file")
	}
}

// A token in a file the fleet's loader read is found in what it read, at its place; one
// in a file that a .gitignore below the top leaves out is not git's to commit, and is
// not reported.
func TestValidateFindsATokenInAClusterFileAndNotInAnIgnoredOne(t *testing.T) {
	r := newHubRepo(t)
	r.add(t, "gpu-east")
	tok := r.valuesToken(t, "gpu-east")
	clusterFile := filepath.Join(r.dir, "clusters", "gpu-east", "cluster.yaml")
	data, err := os.ReadFile(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(string(data), "\n")
	if err := os.WriteFile(clusterFile, append(data, "# enrolled with "+tok.Reveal()+"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	fleetgen.WriteInto(t, r.dir, fstest.MapFS{
		"docs/.gitignore":        {Data: []byte("scratch/\n")},
		"docs/scratch/notes.txt": {Data: []byte("the token: " + tok.Reveal() + "\n")},
	})
	code, _, errOut := runCLI(t, "validate", r.dir)
	if code != 1 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if want := fmt.Sprintf("clusters/gpu-east/cluster.yaml:%d:17: a plaintext enrollment token (fingerprint %s)", lines+1, tok.Hash().Fingerprint()); !strings.Contains(errOut, want) {
		t.Errorf("stderr %q lacks %q", errOut, want)
	}
	if strings.Contains(errOut, "docs/scratch") {
		t.Errorf("validate reported a file that docs/.gitignore leaves out: %q", errOut)
	}
	if strings.Contains(errOut, tok.Reveal()) {
		t.Fatal("validate printed the leaked token")
	}
}

func TestValidateWithAnotherHubsKeyNamesTheFile(t *testing.T) {
	r := newHubRepo(t)
	r.add(t, "gpu-east")
	other := sopstest.WriteKeyFile(t, t.TempDir(), "other.agekey", sopstest.NewIdentity(t))
	code, _, errOut := runCLI(t, "validate", r.dir, "--age-key", other)
	if code != 1 || !strings.Contains(errOut, "clusters/gpu-east/enrollment.sops.yaml:1:1: no identity can decrypt: it is encrypted to age1") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := runCLI(t, "validate", r.dir); code != 0 {
		t.Fatalf("without --age-key the checks are structural and pass; got exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "validate", r.dir, "--age-key", filepath.Join(t.TempDir(), "missing")); code != 1 || !strings.Contains(errOut, "no such file") {
		t.Fatalf("a missing key file: exit %d, %q", code, errOut)
	}
}

func TestFleetInitRefuses(t *testing.T) {
	recipient := sopstest.Recipients(sopstest.NewIdentity(t))
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "keep.txt"), []byte("mine"), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		msg  string
	}{
		{"a directory that is not empty", []string{full, "--tenant", "acme", "--hub-url", "wss://h", "--age-recipient", recipient}, "is not empty"},
		{"an invalid tenant", []string{"x", "--tenant", "Acme Corp", "--hub-url", "wss://h", "--age-recipient", recipient}, `--tenant "Acme Corp"`},
		{"plain ws to a remote hub", []string{"x", "--tenant", "acme", "--hub-url", "ws://hub.acme.test", "--age-recipient", recipient}, "allowed only to a loopback host"},
		{"an https hub URL", []string{"x", "--tenant", "acme", "--hub-url", "https://hub.acme.test", "--age-recipient", recipient}, "https:// is not accepted"},
		{"a recipient that is not an age key", []string{"x", "--tenant", "acme", "--hub-url", "wss://h", "--age-recipient", "ssh-ed25519 AAAA"}, "not an age public key"},
		{"no recipient", []string{"x", "--tenant", "acme", "--hub-url", "wss://h"}, `required flag(s) "age-recipient" not set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cwd := t.TempDir()
			t.Chdir(cwd)
			code, _, errOut := runCLI(t, append([]string{"fleet", "init"}, tc.args...)...)
			if code != 1 || !strings.Contains(errOut, tc.msg) {
				t.Fatalf("exit %d, stderr %q; want %q", code, errOut, tc.msg)
			}
			if entries, _ := os.ReadDir(cwd); len(entries) > 0 {
				t.Errorf("fleet init left %s behind", entries[0].Name())
			}
		})
	}
	if entries, _ := os.ReadDir(full); len(entries) != 1 {
		t.Errorf("fleet init changed a directory that was not empty")
	}
}
