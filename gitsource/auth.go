package gitsource

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// HTTPAuth is basic authentication over HTTPS. For a forge token, user is what the
// forge asks for ("x-access-token" on GitHub, "oauth2" on GitLab, any on Gitea).
func HTTPAuth(user, password string) transport.AuthMethod {
	return &http.BasicAuth{Username: user, Password: password}
}

// SSHAuth authenticates with a private key in PEM or OpenSSH form, and checks the server
// against knownHosts (the contents of a known_hosts file). There is no way to skip the
// host-key check: an empty knownHosts is an error.
func SSHAuth(user string, privateKey, passphrase, knownHosts []byte) (transport.AuthMethod, error) {
	if user == "" {
		user = "git"
	}
	keys, err := gitssh.NewPublicKeys(user, privateKey, string(passphrase))
	if err != nil {
		return nil, errors.New("gitsource: the SSH private key cannot be read (wrong format or passphrase)")
	}
	if len(strings.TrimSpace(string(knownHosts))) == 0 {
		return nil, errors.New("gitsource: no known_hosts for SSH; the server's host key must be known")
	}
	check, err := knownHostsCallback(knownHosts)
	if err != nil {
		return nil, err
	}
	keys.HostKeyCallback = check
	return keys, nil
}

// knownHostsCallback parses known_hosts contents. The library reads only files, and
// reads them once, so the contents pass through a private temporary file.
func knownHostsCallback(data []byte) (ssh.HostKeyCallback, error) {
	f, err := os.CreateTemp("", "known_hosts-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return nil, werr
	}
	cb, err := knownhosts.New(f.Name())
	if err != nil {
		return nil, fmt.Errorf("gitsource: known_hosts: %s", strings.ReplaceAll(err.Error(), f.Name(), "known_hosts"))
	}
	return cb, nil
}

// RedactURL drops credentials written into a URL. An SSH URL's user is a login name
// ("git"), never a secret, and is kept.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		// A URL that does not parse may still hold credentials: everything between the
		// scheme and the last @ goes, with the host if a path holds an @ too.
		scheme, rest, ok := strings.Cut(s, "://")
		if at := strings.LastIndex(rest, "@"); ok && at >= 0 {
			return scheme + "://redacted@" + rest[at+1:]
		}
		return s
	}
	if u.User == nil {
		return s
	}
	if _, hasPassword := u.User.Password(); u.Scheme == "ssh" && !hasPassword {
		return s
	}
	u.User = url.User("redacted")
	return u.String()
}

// RedactError keeps a password or token out of a transport error's text, whatever the
// library put into it: auth's password, and the user name of rawURL, the repository's
// URL, where RedactURL takes it for a token (net/http writes the URL it asked into its
// errors and leaves out only a password).
func RedactError(err error, auth transport.AuthMethod, rawURL string) string {
	msg := err.Error()
	switch {
	case errors.Is(err, transport.ErrAuthenticationRequired) || errors.Is(err, transport.ErrAuthorizationFailed):
		msg = "authentication failed: the credentials were refused or are missing"
	case strings.Contains(msg, "ssh: unable to authenticate"):
		msg = "authentication failed: the server refused the SSH key"
	case strings.Contains(msg, "knownhosts: key mismatch"):
		msg = "the server's SSH host key differs from the one in known_hosts (knownhosts: key mismatch): refusing to connect"
	case strings.Contains(msg, "knownhosts: key is unknown"):
		msg = "the server's SSH host key is not in known_hosts (knownhosts: key is unknown): refusing to connect"
	}
	if b, ok := auth.(*http.BasicAuth); ok && b.Password != "" {
		msg = strings.ReplaceAll(msg, b.Password, "[REDACTED]")
	}
	if u, err := url.Parse(rawURL); err == nil && u.User != nil && RedactURL(rawURL) != rawURL {
		// As written in a URL, in whichever escaping: followed by its @, or by the :
		// of a password (which net/http writes as ***).
		for _, user := range []string{u.User.String(), u.User.Username()} {
			if user != "" {
				msg = strings.ReplaceAll(msg, user+"@", "redacted@")
				msg = strings.ReplaceAll(msg, user+":", "redacted:")
			}
		}
	}
	return msg
}
