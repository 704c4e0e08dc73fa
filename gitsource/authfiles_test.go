package gitsource_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

func TestAuthFromFilesReadsTheRepositoryWithTheCredentialsTheFilesHold(t *testing.T) {
	authorized, key := gitserver.NewSSHKey(t)
	_, strangerKey := gitserver.NewSSHKey(t)
	const user, password = "fleet-admin", "http-pa55word"
	srv := gitserver.StartSSH(t, user, password, authorized)
	repo := srv.NewRepo(t, "fleet", template)
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	knownHosts := file("known_hosts", string(srv.KnownHosts(t)))

	tests := []struct {
		name    string
		url     string
		auth    gitsource.FileAuth
		wantErr string // in the fetch's error; empty means it reads the head
	}{
		{"a password file, its newline dropped", repo.URL(),
			gitsource.FileAuth{Username: user, PasswordFile: file("password", password+"\n")}, ""},
		{"a wrong password is refused", repo.URL(),
			gitsource.FileAuth{Username: user, PasswordFile: file("wrong-password", "not-"+password)}, "authentication"},
		{"no credentials for a server that wants them", repo.URL(), gitsource.FileAuth{}, "authentication"},
		{"an SSH key with known_hosts", repo.SSHURL(),
			gitsource.FileAuth{SSHKeyFile: file("id", string(key)), KnownHostsFile: knownHosts}, ""},
		{"an SSH key the server does not know", repo.SSHURL(),
			gitsource.FileAuth{SSHKeyFile: file("stranger", string(strangerKey)), KnownHostsFile: knownHosts}, "authentication"},
		{"a known_hosts naming another host", repo.SSHURL(),
			gitsource.FileAuth{SSHKeyFile: file("id2", string(key)),
				KnownHostsFile: file("other_hosts", "[git.example]:22 "+strings.SplitN(string(srv.KnownHosts(t)), " ", 2)[1])}, "key is unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			auth, err := gitsource.AuthFromFiles(tt.auth)
			if err != nil {
				t.Fatal(err)
			}
			s, err := gitsource.New(gitsource.Options{URL: tt.url, Branch: "main", Auth: auth})
			if err != nil {
				t.Fatal(err)
			}
			head, err := s.RemoteHead(t.Context())
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("reading the head: %v", err)
				}
				if head.String() != repo.Head("main") {
					t.Fatalf("head %s, want %s", head, repo.Head("main"))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("reading the head: %v; want an error saying %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("the error repeats the password: %v", err)
			}
		})
	}
}

func TestAuthFromFilesRefusesFilesThatCannotAuthenticate(t *testing.T) {
	_, key := gitserver.NewSSHKey(t)
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const secret = "s3cret-in-the-file"
	keyFile := file("id", string(key))
	missing := filepath.Join(dir, "missing")

	tests := []struct {
		name string
		auth gitsource.FileAuth
		want []string // in the error
	}{
		{"a password file and an SSH key at once",
			gitsource.FileAuth{PasswordFile: file("password", secret), SSHKeyFile: keyFile},
			[]string{"exclude each other", filepath.Join(dir, "password"), keyFile}},
		{"a missing password file", gitsource.FileAuth{PasswordFile: missing}, []string{"password file", missing}},
		{"a missing SSH key", gitsource.FileAuth{SSHKeyFile: missing, KnownHostsFile: file("hosts", "x")}, []string{"SSH key", missing}},
		{"an SSH key without known_hosts", gitsource.FileAuth{SSHKeyFile: keyFile}, []string{keyFile, "needs a known_hosts file"}},
		{"a missing known_hosts", gitsource.FileAuth{SSHKeyFile: keyFile, KnownHostsFile: missing}, []string{"known_hosts", missing}},
		{"an empty known_hosts", gitsource.FileAuth{SSHKeyFile: keyFile, KnownHostsFile: file("empty_hosts", "\n")},
			[]string{"no known_hosts", filepath.Join(dir, "empty_hosts")}},
		{"a file that is no SSH key", gitsource.FileAuth{SSHKeyFile: file("not-a-key", secret), KnownHostsFile: file("hosts2", "x")},
			[]string{"SSH private key cannot be read", filepath.Join(dir, "not-a-key")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			auth, err := gitsource.AuthFromFiles(tt.auth)
			if err == nil {
				t.Fatalf("got %T, want an error", auth)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("the error repeats the file's content: %v", err)
			}
		})
	}

	if auth, err := gitsource.AuthFromFiles(gitsource.FileAuth{Username: "someone"}); auth != nil || err != nil {
		t.Errorf("no files: %v, %v; want anonymous access (nil, nil)", auth, err)
	}
}
