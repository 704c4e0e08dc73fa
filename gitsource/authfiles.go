package gitsource

import (
	"cmp"
	"fmt"
	"os"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/transport"
)

// FileAuth names the files that hold the credentials for reading a repository: a
// password or forge token for HTTPS, or an SSH key with the known_hosts file its server
// is checked against. Secrets live in files, never in flags or configuration values,
// where process listings and logs would show them.
type FileAuth struct {
	// Username is the HTTP user with PasswordFile, or the SSH user with SSHKeyFile;
	// empty means "git".
	Username string
	// PasswordFile holds the HTTP password or forge token. Surrounding whitespace, such
	// as the newline an editor leaves, is not part of it.
	PasswordFile string
	// SSHKeyFile holds an SSH private key without passphrase, in PEM or OpenSSH form.
	SSHKeyFile string
	// KnownHostsFile is the known_hosts file that the SSH server's host key must be in;
	// required with SSHKeyFile, since a host-key check cannot be skipped.
	KnownHostsFile string
}

// AuthFromFiles reads the credentials f names. It returns nil, and no error, when f
// names none: the repository is read anonymously. Errors name the file concerned and
// never repeat what is in it.
func AuthFromFiles(f FileAuth) (transport.AuthMethod, error) {
	switch {
	case f.PasswordFile != "" && f.SSHKeyFile != "":
		return nil, fmt.Errorf("gitsource: the password file %s and the SSH key %s exclude each other; give one", f.PasswordFile, f.SSHKeyFile)
	case f.PasswordFile != "":
		pw, err := os.ReadFile(f.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("gitsource: reading the password file: %w", err)
		}
		return HTTPAuth(cmp.Or(f.Username, "git"), strings.TrimSpace(string(pw))), nil
	case f.SSHKeyFile != "":
		key, err := os.ReadFile(f.SSHKeyFile)
		if err != nil {
			return nil, fmt.Errorf("gitsource: reading the SSH key: %w", err)
		}
		if f.KnownHostsFile == "" {
			return nil, fmt.Errorf("gitsource: the SSH key %s needs a known_hosts file: the server's host key must be known", f.SSHKeyFile)
		}
		hosts, err := os.ReadFile(f.KnownHostsFile)
		if err != nil {
			return nil, fmt.Errorf("gitsource: reading known_hosts, as the server's host key must be known: %w", err)
		}
		auth, err := SSHAuth(f.Username, key, nil, hosts)
		if err != nil {
			return nil, fmt.Errorf("%w (SSH key %s, known_hosts %s)", err, f.SSHKeyFile, f.KnownHostsFile)
		}
		return auth, nil
	}
	return nil, nil
}
