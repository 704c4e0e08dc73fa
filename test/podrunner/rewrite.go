package podrunner

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// mount is a container's mount path and the directory that plays it.
type mount struct{ path, host string }

// rewriter rewrites what a container names of its pod's world into this machine's: mount
// paths into the volumes' directories, listen addresses of container ports into their
// loopback ports, and Services' cluster DNS names into their loopback addresses. There are
// no mount namespaces, network namespaces or cluster DNS here; nothing else is changed.
type rewriter struct {
	// mounts, the longest path first.
	mounts []mount
	// ports maps a container port to its loopback address.
	ports map[int32]string
	// service returns the loopback address of a Service's port.
	service func(namespace, name string, port int32) (string, error)
	// changes are the rewrites made, [from, to], for the log.
	changes [][2]string
	// errs are the Service addresses that could not be had.
	errs []error
}

var (
	// listenAddr is an address to listen on every interface: ":8443", "0.0.0.0:8443", "[::]:8443".
	listenAddr = regexp.MustCompile(`^(?:0\.0\.0\.0|\[::\])?:(\d{1,5})$`)
	// serviceURL is a URL whose host is a Service's cluster DNS name.
	serviceURL = regexp.MustCompile(`^([a-z][a-z0-9+.-]*)://([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(?:\.cluster\.local)?(?::(\d{1,5}))?(/.*)?$`)
)

// defaultPorts are the ports of URL schemes whose URL gives none.
var defaultPorts = map[string]int32{"http": 80, "ws": 80, "https": 443, "wss": 443}

// str rewrites one string, when it is a path under a mount, a listen address of a
// container port, or a URL of a Service.
func (w *rewriter) str(s string) string {
	out := s
	switch {
	case strings.HasPrefix(s, "/"):
		for _, m := range w.mounts {
			if s == m.path || strings.HasPrefix(s, m.path+"/") {
				out = m.host + strings.TrimPrefix(s, m.path)
				break
			}
		}
	case listenAddr.MatchString(s):
		port, _ := strconv.Atoi(listenAddr.FindStringSubmatch(s)[1])
		if a, ok := w.ports[int32(port)]; ok {
			out = a
		}
	case serviceURL.MatchString(s):
		m := serviceURL.FindStringSubmatch(s)
		scheme, name, namespace, portText, rest := m[1], m[2], m[4], m[6], m[7]
		port, ok := defaultPorts[scheme]
		if portText != "" {
			n, _ := strconv.Atoi(portText)
			port, ok = int32(n), true
		}
		if !ok {
			break
		}
		addr, err := w.service(namespace, name, port)
		if err != nil {
			w.errs = append(w.errs, err)
			break
		}
		out = scheme + "://" + addr + rest
	}
	if out != s {
		w.changes = append(w.changes, [2]string{s, out})
	}
	return out
}

// arg rewrites a command-line argument: the value of --name=value, or the whole argument.
func (w *rewriter) arg(a string) string {
	if strings.HasPrefix(a, "-") {
		if name, v, ok := strings.Cut(a, "="); ok {
			return name + "=" + w.str(v)
		}
	}
	return w.str(a)
}

// rewriteFile rewrites the strings of the YAML (or JSON) file at p when p is a file under
// one of the mounts' directories, in place: the Runner's copy of a volume, not the volume's
// source. A file that is not a YAML mapping or list, or in which nothing changes, is left
// as it is.
func (w *rewriter) rewriteFile(p string) error {
	inside := false
	for _, m := range w.mounts {
		if p == m.host || strings.HasPrefix(p, m.host+"/") {
			inside = true
		}
	}
	if !inside {
		return nil
	}
	info, err := os.Stat(p)
	if err != nil || !info.Mode().IsRegular() {
		return nil
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	out, changed, err := w.yaml(data)
	if err != nil || !changed {
		return err
	}
	return os.WriteFile(p, out, info.Mode().Perm())
}

// yaml rewrites every string of a YAML document and says whether any changed. A document
// that is not a mapping or a list is not a configuration file and is left alone.
func (w *rewriter) yaml(data []byte) ([]byte, bool, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return data, false, nil
	}
	if k := doc.Content[0].Kind; k != yaml.MappingNode && k != yaml.SequenceNode {
		return data, false, nil
	}
	before := len(w.changes)
	w.walk(&doc)
	if err := errors.Join(w.errs...); err != nil {
		return nil, false, err
	}
	if len(w.changes) == before {
		return data, false, nil
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, false, fmt.Errorf("writing the rewritten file: %w", err)
	}
	return b.Bytes(), true, enc.Close()
}

func (w *rewriter) walk(n *yaml.Node) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		n.Value = w.str(n.Value)
		return
	}
	for i, c := range n.Content {
		// A mapping's keys are names, not values to rewrite.
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			continue
		}
		w.walk(c)
	}
}

// prefixWriter writes each line it is given to w with a prefix, whole lines at a time, so
// that the lines of several processes sharing w do not interleave.
type prefixWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func newPrefixWriter(w io.Writer, prefix string) *prefixWriter {
	return &prefixWriter{w: w, prefix: prefix}
}

// Write is called by one goroutine of os/exec at a time per writer: the process's stdout and
// stderr share the writer, and exec copies both through one pipe when they are the same.
func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		line := append([]byte(p.prefix), p.buf[:i+1]...)
		p.buf = p.buf[i+1:]
		if _, err := p.w.Write(line); err != nil {
			return len(b), err
		}
	}
	return len(b), nil
}

// flush writes what is left of a last line without its newline, once the process has
// exited.
func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		_, _ = p.w.Write(append(append([]byte(p.prefix), p.buf...), '\n'))
		p.buf = nil
	}
}
