package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// token is shaped like a real one; no message may ever contain it.
const token = "flt1_sekritsekritsekritsekritsekritsekritsekritsekritsekritsekrit"

// handover is the values file `flotilla cluster add` writes.
const handover = `# Values of the flotilla-agent chart for worker cluster gpu-a of tenant acme.
hub:
  url: wss://hub.example.com/
cluster:
  tenant: acme
  name: gpu-a
  identity: 4-acme-gpu-a
enrollment:
  token: ` + token + `
`

// invoke runs the command line as main does, with the agent replaced by one that
// records the configuration it was given.
func invoke(t *testing.T, env map[string]string, args ...string) (cfg *config, stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, &out, &errOut, func(k string) string { return env[k] },
		func(_ context.Context, c *config) error { cfg = c; return nil })
	return cfg, out.String(), errOut.String(), code
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValuesAndFlags(t *testing.T) {
	dir := t.TempDir()
	caPEM := selfSignedPEM(t)
	writeFile(t, dir, "hub-ca.pem", caPEM)
	tokenFile := writeFile(t, dir, "token", "flt1_fromthefile\n")
	emptyTokenFile := writeFile(t, dir, "empty-token", "\n")

	tests := []struct {
		name   string
		values string // written to values.yaml when not empty
		args   []string
		env    map[string]string
		want   func(t *testing.T, c *config)
		// wantErr are substrings of the error; empty means success.
		wantErr []string
	}{
		{
			name:   "the handover file runs the agent with defaults for the rest",
			values: handover,
			want: func(t *testing.T, c *config) {
				check(t, "HubURL", c.HubURL, "wss://hub.example.com")
				check(t, "Identity", c.Identity, "4-acme-gpu-a")
				check(t, "Tenant", c.Tenant, "acme")
				check(t, "Cluster", c.Cluster, "gpu-a")
				check(t, "EnrollmentToken", c.EnrollmentToken.Reveal(), token)
				check(t, "Namespace", c.Namespace, "flotilla-system")
				check(t, "CredentialSecret", c.CredentialSecret, "flotilla-agent-credential")
				check(t, "Listen", c.Listen, ":8080")
				check(t, "Liveness", c.Liveness, protocol.DefaultLiveness)
				check(t, "RootCAs", c.RootCAs == nil, true)
				check(t, "DCGMURL", c.DCGMURL, "")
				check(t, "Dispatch", c.Dispatch, true)
			},
		},
		{
			name:   "dispatch is turned off in the file",
			values: handover + "dispatch:\n  enabled: false\n",
			want:   func(t *testing.T, c *config) { check(t, "Dispatch", c.Dispatch, false) },
		},
		{
			name:   "the dispatch flag overrides the file",
			values: handover + "dispatch:\n  enabled: true\n",
			args:   []string{"--dispatch=false"},
			want:   func(t *testing.T, c *config) { check(t, "Dispatch", c.Dispatch, false) },
		},
		{
			name:    "dispatch.enabled must be a YAML boolean",
			values:  handover + "dispatch:\n  enabled: yes\n",
			wantErr: []string{`values.yaml:11 (dispatch.enabled): dispatch.enabled "yes" is neither true nor false`},
		},
		{
			name:   "the namespace defaults to the pod's",
			values: handover,
			env:    map[string]string{namespaceEnv: "agents"},
			want:   func(t *testing.T, c *config) { check(t, "Namespace", c.Namespace, "agents") },
		},
		{
			name: "every agent setting is read from the file",
			values: handover + `agent:
  namespace: from-file
  credentialSecret: my-credential
  caBundle: hub-ca.pem
  heartbeat: 4s
  dcgmURL: http://dcgm.gpu-operator:9400/metrics
  listen: 127.0.0.1:9090
  logLevel: debug
`,
			env: map[string]string{namespaceEnv: "from-env"},
			want: func(t *testing.T, c *config) {
				check(t, "Namespace", c.Namespace, "from-file")
				check(t, "CredentialSecret", c.CredentialSecret, "my-credential")
				check(t, "RootCAs", c.RootCAs != nil, true)
				check(t, "Liveness", c.Liveness, protocol.Liveness{Interval: 4 * time.Second, Timeout: 12 * time.Second})
				check(t, "DCGMURL", c.DCGMURL, "http://dcgm.gpu-operator:9400/metrics")
				check(t, "Listen", c.Listen, "127.0.0.1:9090")
				check(t, "LogLevel", c.LogLevel.String(), "DEBUG")
			},
		},
		{
			name:   "an inline PEM CA bundle is used as it is",
			values: handover + "agent:\n  caBundle: |\n" + indent(caPEM, "    "),
			want:   func(t *testing.T, c *config) { check(t, "RootCAs", c.RootCAs != nil, true) },
		},
		{
			name:   "flags override the file",
			values: handover + "agent:\n  namespace: from-file\n  heartbeat: 4s\n  listen: :9090\n",
			args: []string{"--hub-url", "wss://other.example.com:8443", "--identity", "4-acme-gpu-b", "--namespace", "from-flag",
				"--credential-secret", "flag-credential", "--heartbeat", "20s", "--listen", ":7070", "--dcgm-url", "https://dcgm/metrics",
				"--ca-bundle", filepath.Join(dir, "hub-ca.pem")},
			want: func(t *testing.T, c *config) {
				check(t, "HubURL", c.HubURL, "wss://other.example.com:8443")
				check(t, "Identity", c.Identity, "4-acme-gpu-b")
				check(t, "Namespace", c.Namespace, "from-flag")
				check(t, "CredentialSecret", c.CredentialSecret, "flag-credential")
				check(t, "Liveness", c.Liveness, protocol.Liveness{Interval: 20 * time.Second, Timeout: time.Minute})
				check(t, "Listen", c.Listen, ":7070")
				check(t, "DCGMURL", c.DCGMURL, "https://dcgm/metrics")
				check(t, "RootCAs", c.RootCAs != nil, true)
			},
		},
		{
			name: "flags alone are enough",
			args: []string{"--hub-url", "wss://hub.example.com", "--identity", "4-acme-gpu-a"},
			want: func(t *testing.T, c *config) {
				check(t, "HubURL", c.HubURL, "wss://hub.example.com")
				check(t, "EnrollmentToken", c.EnrollmentToken.Reveal(), "")
			},
		},
		{
			name:   "the token file overrides the file's token",
			values: handover,
			args:   []string{"--enrollment-token-file", tokenFile},
			want: func(t *testing.T, c *config) {
				check(t, "EnrollmentToken", c.EnrollmentToken.Reveal(), "flt1_fromthefile")
			},
		},
		{
			name:   "Helm's own values are left to Helm",
			values: "image:\n  repository: example/agent\nresources: {}\n" + handover + "extraEnv: []\n",
			want:   func(t *testing.T, c *config) { check(t, "Identity", c.Identity, "4-acme-gpu-a") },
		},
		{
			name:   "empty settings of the chart's values.yaml mean the default",
			values: "hub:\n  url: wss://hub.example.com\ncluster:\n  tenant: \"\"\n  name:\n  identity: 4-acme-gpu-a\nenrollment:\n  token: \"\"\nagent:\n  caBundle: \"\"\n  heartbeat: \"\"\n  dcgmURL: \"\"\n",
			want: func(t *testing.T, c *config) {
				check(t, "Liveness", c.Liveness, protocol.DefaultLiveness)
				check(t, "EnrollmentToken", c.EnrollmentToken.Reveal(), "")
			},
		},
		{
			name:    "a missing identity is refused",
			values:  strings.Replace(handover, "  identity: 4-acme-gpu-a\n", "", 1),
			wantErr: []string{"cluster.identity is required", "--identity"},
		},
		{
			name:    "a missing hub URL is refused",
			values:  strings.Replace(handover, "  url: wss://hub.example.com/\n", "", 1),
			wantErr: []string{"hub.url is required"},
		},
		{
			name:    "malformed YAML is placed at its file and line",
			values:  "hub:\n  url: wss://hub.example.com\ncluster:\n  identity: [4-acme-gpu-a\nenrollment:\n  token: " + token + "\n",
			wantErr: []string{"values.yaml:4: invalid YAML"},
		},
		{
			name:    "a syntax error on the token's line does not repeat the token",
			values:  "hub:\n  url: wss://hub.example.com\nenrollment:\n  token: " + token + ": x\n",
			wantErr: []string{"values.yaml:4: invalid YAML: mapping values are not allowed"},
		},
		{
			name:    "an unterminated quote around the token is placed at its line",
			values:  "hub:\n  url: wss://hub.example.com\nenrollment:\n  token: \"" + token + "\n",
			wantErr: []string{"values.yaml:4: invalid YAML"},
		},
		{
			name:    "a misspelt setting is refused at its line",
			values:  handover + "agent:\n  heartbeet: 5s\n",
			wantErr: []string{`values.yaml:11: unknown setting "heartbeet"; agent takes namespace, credentialSecret`},
		},
		{
			name:    "a setting set twice is refused",
			values:  handover + "hub:\n  url: wss://other.example.com\n",
			wantErr: []string{"values.yaml:10: hub is set twice; it is already set at line 2"},
		},
		{
			name:    "a list where a value belongs is refused at its line",
			values:  handover + "agent:\n  listen: [\":8080\"]\n",
			wantErr: []string{"values.yaml:11: agent.listen must be a single value, not a list"},
		},
		{
			name:    "a token that is a mapping is refused without its content",
			values:  "hub:\n  url: wss://hub.example.com\ncluster:\n  identity: x\nenrollment:\n  token:\n    " + token + ": x\n",
			wantErr: []string{"values.yaml:7: enrollment.token must be a single value, not a mapping"},
		},
		{
			name:    "a second YAML document is refused",
			values:  handover + "---\nhub:\n  url: wss://other.example.com\n",
			wantErr: []string{"values.yaml:10: a values file holds one YAML document"},
		},
		{
			name:    "an http hub URL is refused",
			values:  strings.Replace(handover, "wss://hub.example.com/", "http://hub.example.com", 1),
			wantErr: []string{`values.yaml:3 (hub.url): hub URL "http://hub.example.com" must be a wss:// URL`},
		},
		{
			name:    "an https hub URL is refused",
			args:    []string{"--hub-url", "https://hub.example.com", "--identity", "x"},
			wantErr: []string{"--hub-url: ", "must be a wss:// URL"},
		},
		{
			name:    "ws to a remote host is refused even with the loopback flag",
			args:    []string{"--hub-url", "ws://hub.example.com", "--identity", "x", "--allow-insecure-loopback"},
			wantErr: []string{"unencrypted ws://", "allowed only to a loopback host"},
		},
		{
			name:    "ws to loopback is refused without the flag",
			args:    []string{"--hub-url", "ws://127.0.0.1:9443", "--identity", "x"},
			wantErr: []string{"unencrypted ws://", "--allow-insecure-loopback"},
		},
		{
			name: "ws to loopback is accepted with the flag",
			args: []string{"--hub-url", "ws://127.0.0.1:9443", "--identity", "x", "--allow-insecure-loopback"},
			want: func(t *testing.T, c *config) { check(t, "HubURL", c.HubURL, "ws://127.0.0.1:9443") },
		},
		{
			name: "ws to localhost and to ::1 is accepted with the flag",
			args: []string{"--hub-url", "ws://[::1]:9443", "--identity", "x", "--allow-insecure-loopback"},
			want: func(t *testing.T, c *config) { check(t, "HubURL", c.HubURL, "ws://[::1]:9443") },
		},
		{
			name:    "a hub URL with credentials is refused without them",
			args:    []string{"--hub-url", "wss://user:pa55word@hub.example.com", "--identity", "x"},
			wantErr: []string{"carries credentials"},
		},
		{
			name:    "a hub URL with a query is refused",
			args:    []string{"--hub-url", "wss://hub.example.com/?x=1", "--identity", "x"},
			wantErr: []string{"no query or fragment"},
		},
		{
			name:    "an identity that is no label value is refused",
			args:    []string{"--hub-url", "wss://hub.example.com", "--identity", "not an identity"},
			wantErr: []string{"--identity: identity \"not an identity\" is not a label value"},
		},
		{
			name:    "an empty token file is refused",
			values:  handover,
			args:    []string{"--enrollment-token-file", emptyTokenFile},
			wantErr: []string{"the enrollment token file is empty"},
		},
		{
			name:    "a missing token file is refused",
			values:  handover,
			args:    []string{"--enrollment-token-file", filepath.Join(dir, "nope")},
			wantErr: []string{"reading the enrollment token", "no such file"},
		},
		{
			name:    "a token with whitespace inside is refused without repeating it",
			values:  strings.Replace(handover, "token: "+token, `token: "`+token[:20]+" "+token[20:]+`"`, 1),
			wantErr: []string{"values.yaml:9 (enrollment.token): the enrollment token holds a character"},
		},
		{
			name:    "a heartbeat that is no duration is refused",
			values:  handover + "agent:\n  heartbeat: 5\n",
			wantErr: []string{`values.yaml:11 (agent.heartbeat): heartbeat "5" is not a duration`},
		},
		{
			name:    "a heartbeat under a second is refused",
			args:    []string{"--hub-url", "wss://hub.example.com", "--identity", "x", "--heartbeat", "10ms"},
			wantErr: []string{"--heartbeat: heartbeat 10ms is shorter than 1s"},
		},
		{
			name:    "a CA bundle without certificates is refused",
			values:  handover + "agent:\n  caBundle: values.yaml\n",
			wantErr: []string{"holds no PEM certificate"},
		},
		{
			name:    "a DCGM URL is checked without being repeated",
			args:    []string{"--hub-url", "wss://hub.example.com", "--identity", "x", "--dcgm-url", "dcgm:9400?token=" + token},
			wantErr: []string{"--dcgm-url: the DCGM exporter URL is not an absolute http or https URL"},
		},
		{
			name:    "every problem is reported at once",
			values:  "hub:\n  url: http://hub.example.com\nagent:\n  listen: nowhere\n  logLevel: loud\nenrollment:\n  token: " + token + "\n",
			wantErr: []string{"must be a wss:// URL", "cluster.identity is required", `listen address "nowhere"`, `log level "loud"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.values != "" {
				args = append([]string{"--values", writeFile(t, dir, "values.yaml", tt.values)}, args...)
			}
			// Relative paths in the values file are resolved from its directory,
			// not from the working directory.
			cfg, stdout, stderr, code := invoke(t, tt.env, args...)
			if strings.Contains(stdout+stderr, token) || strings.Contains(stdout+stderr, "pa55word") {
				t.Errorf("output repeats a secret:\n%s%s", stdout, stderr)
			}
			if len(tt.wantErr) == 0 {
				if code != 0 {
					t.Fatalf("exit code %d, stderr:\n%s", code, stderr)
				}
				tt.want(t, cfg)
				if s := fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg); strings.Contains(s, token) {
					t.Errorf("printing the configuration shows the token: %s", s)
				}
				return
			}
			if code == 0 {
				t.Fatalf("succeeded; want an error containing %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(stderr, w) {
					t.Errorf("error does not contain %q:\n%s", w, stderr)
				}
			}
		})
	}
}

func TestHelpAndVersionNeverShowTheToken(t *testing.T) {
	dir := t.TempDir()
	values := writeFile(t, dir, "values.yaml", handover)
	tokenFile := writeFile(t, dir, "token", token)
	for _, args := range [][]string{
		{"--help"},
		{"--values", values, "--help"},
		{"--values", values, "--enrollment-token-file", tokenFile, "--help"},
		{"--values", values, "--version"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			cfg, stdout, stderr, code := invoke(t, nil, args...)
			if code != 0 {
				t.Fatalf("exit code %d: %s", code, stderr)
			}
			if cfg != nil {
				t.Error("the agent was started")
			}
			if strings.Contains(stdout+stderr, token) {
				t.Errorf("output shows the token:\n%s", stdout+stderr)
			}
			if args[len(args)-1] == "--help" && !strings.Contains(stdout, "--enrollment-token-file") {
				t.Errorf("help does not describe --enrollment-token-file:\n%s", stdout)
			}
		})
	}
}

func TestThereIsNoTokenFlag(t *testing.T) {
	cmd := newRootCommand(func(string) string { return "" }, nil)
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if strings.Contains(f.Name, "token") && f.Name != "enrollment-token-file" {
			t.Errorf("flag --%s would put a token on the command line", f.Name)
		}
	})
}

func TestYAMLErrorsNameTheirLine(t *testing.T) {
	tests := []struct {
		name, data, want string
	}{
		{"a parser problem names the line its construct starts on", "a: b\nc:\n  - x\n  y: z\n", "f.yaml:3: invalid YAML: did not find expected '-' indicator"},
		{"a scanner problem on the first line", "a: @x\n", "f.yaml:1: invalid YAML: found character that cannot start any token"},
		{"a tab for indentation", "a:\n\t- b\n", "f.yaml:2: invalid YAML: found character that cannot start any token"},
		{"a flow sequence left open", "a: b\nc: [d\n", "f.yaml:2: invalid YAML: did not find expected ',' or ']'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseValues("f.yaml", []byte(tt.data))
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error %v, want it to start with %q", err, tt.want)
			}
		})
	}
}

func check[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

func selfSignedPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "flotilla test hub CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
