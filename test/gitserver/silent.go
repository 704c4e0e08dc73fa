package gitserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// NewSSHKey is a fresh ed25519 key pair for an SSH client: the public key to authorize,
// and the private key in OpenSSH PEM form, as a hub is given it.
func NewSSHKey(t testing.TB) (ssh.PublicKey, []byte) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return sshPub, pem.EncodeToMemory(block)
}

// Silent is an SSH server that accepts connections and never answers: no banner, no key
// exchange, as a server that hangs does. A client under test has only its own context
// to give up by. The connections stay open until the test closes them or ends.
type Silent struct {
	port int
	// hostKey is the key KnownHosts names, in authorized_keys form.
	hostKey []byte
	conns   chan net.Conn

	mu   sync.Mutex
	open []net.Conn
}

// StartSilent starts a Silent server on the loopback interface, stopped when t ends.
func StartSilent(t testing.TB) *Silent {
	t.Helper()
	hostKey, _ := NewSSHKey(t)
	return startSilent(t, ssh.MarshalAuthorizedKey(hostKey), nil)
}

// SSHSilentExcept is a Silent server in front of the SSH server of s that forwards the
// connections answer says to, by their number in the order accepted from 0: a server
// that hangs on some connections and serves others, so that a test reaches the step of
// a client that it means to hang.
func (s *Server) SSHSilentExcept(t testing.TB, answer func(n int) bool) *Silent {
	t.Helper()
	if s.hostKeyFile == "" {
		t.Fatal("the git server does not serve SSH")
	}
	hostKey, err := os.ReadFile(s.hostKeyFile)
	if err != nil {
		t.Fatalf("reading the SSH host key: %v", err)
	}
	u, err := url.Parse(s.git.SSHAddress())
	if err != nil {
		t.Fatal(err)
	}
	return startSilent(t, hostKey, func(n int, c net.Conn) ([]net.Conn, bool) {
		if !answer(n) {
			return nil, false
		}
		up, err := net.Dial("tcp", u.Host)
		if err != nil {
			// The client sees the connection end, as from a server that went away.
			c.Close()
			return nil, true
		}
		go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
		go func() { _, _ = io.Copy(c, up); _ = c.(*net.TCPConn).CloseWrite() }()
		return []net.Conn{up}, true
	})
}

// startSilent serves on the loopback interface until t ends. forward, when set, takes
// the connection numbered n to serve it, returning the connections it opened for it,
// or says false to leave it silent.
func startSilent(t testing.TB, hostKey []byte, forward func(n int, c net.Conn) ([]net.Conn, bool)) *Silent {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Silent{port: l.Addr().(*net.TCPAddr).Port, hostKey: hostKey, conns: make(chan net.Conn, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ; n++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.keep(c)
			if forward != nil {
				if opened, ok := forward(n, c); ok {
					s.keep(opened...)
					continue
				}
			}
			select {
			case s.conns <- c:
			default:
				// Nobody takes them: the test counts no more, and the connection
				// hangs all the same.
			}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.open {
			c.Close()
		}
	})
	return s
}

func (s *Silent) keep(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open = append(s.open, cs...)
}

// URL is the SSH clone URL of the repository name on the server.
func (s *Silent) URL(name string) string {
	return fmt.Sprintf("ssh://git@127.0.0.1:%d/%s.git", s.port, name)
}

// KnownHosts is a known_hosts file's contents naming the server's host key at its
// address: a silent server never shows it, so that the host-key check is not what
// stops a client; one that forwards shows the key of the server behind it.
func (s *Silent) KnownHosts(t testing.TB) []byte {
	t.Helper()
	return fmt.Appendf(nil, "[127.0.0.1]:%d %s", s.port, s.hostKey)
}

// Accepted are the connections the server holds silent, in turn (up to 64 not taken
// yet); a test that means one to end before the test does closes it.
func (s *Silent) Accepted() <-chan net.Conn { return s.conns }
