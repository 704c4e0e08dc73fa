package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The values file is the flotilla-agent chart's values file: the one `flotilla cluster
// add` hands to the worker's administrator, or the one the chart renders into the
// agent's ConfigMap. It holds Helm's own settings (image, resources, ...) beside the
// agent's, so only the sections below are read and every other top-level key is left to
// Helm. Inside these sections an unknown key is an error: it is a misspelt setting that
// would otherwise be silently ignored.

// valueKeys lists the keys the agent reads, by section, in the order `--help` and
// errors name them.
func valueKeys(section string) []string {
	switch section {
	case "hub":
		return []string{"url"}
	case "cluster":
		return []string{"tenant", "name", "identity"}
	case "enrollment":
		return []string{"token"}
	case "agent":
		return []string{"namespace", "credentialSecret", "caBundle", "heartbeat", "dcgmURL", "listen", "logLevel"}
	case "dispatch":
		return []string{"enabled", "namespaces", "clusterRole"}
	case "components":
		return []string{"install", "serviceAccount", "allowedRegistries", "requiredDigests"}
	}
	return nil
}

// listKeys are the settings that hold a list of values rather than one.
var listKeys = map[string]bool{"dispatch.namespaces": true, "components.allowedRegistries": true}

// mappingKey tells the settings that hold a mapping of single values: the digests the
// components' images must carry, by image.
func mappingKey(name string) bool { return name == "components.requiredDigests" }

// tokenKey is the one key whose value must never appear in a message.
const tokenKey = "enrollment.token"

// setting is one value of the values file and where it is, for messages.
type setting struct {
	value string
	// items are a list setting's values (listKeys), each as written.
	items []string
	// entries are a mapping setting's values by key (mappingKey), each as written.
	entries map[string]string
	file    string
	line    int
}

func (s setting) where() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

// values are the settings of one values file by dotted key (hub.url). A key set to null
// or to the empty string is absent: the chart's own values.yaml leaves options empty to
// mean "the default".
type values map[string]setting

// parseValues reads the agent's settings from a values file. Every problem is reported
// with the file and line it is on, and none of them repeats a value: the file may hold
// the enrollment token.
func parseValues(file string, data []byte) (values, error) {
	out := values{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return out, nil // an empty file sets nothing
		}
		return nil, yamlError(file, data, err)
	}
	var second yaml.Node
	switch err := dec.Decode(&second); {
	case err == nil:
		return nil, fmt.Errorf("%s:%d: a values file holds one YAML document; a second one starts here", file, second.Line)
	case !errors.Is(err, io.EOF):
		return nil, yamlError(file, data, err)
	}
	if len(doc.Content) == 0 {
		return out, nil
	}
	root := resolve(doc.Content[0])
	if isNull(root) {
		return out, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: expected a mapping of settings at the top of the file", file, root.Line)
	}

	var errs []error
	fail := func(n *yaml.Node, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", file, n.Line, fmt.Sprintf(format, args...)))
	}
	seenSection := map[string]*yaml.Node{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], resolve(root.Content[i+1])
		keys := valueKeys(k.Value)
		if keys == nil {
			continue // Helm's, not the agent's
		}
		if first, dup := seenSection[k.Value]; dup {
			fail(k, "%s is set twice; it is already set at line %d", k.Value, first.Line)
			continue
		}
		seenSection[k.Value] = k
		if isNull(v) {
			continue
		}
		if v.Kind != yaml.MappingNode {
			fail(v, "%s must be a mapping of %s", k.Value, strings.Join(keys, ", "))
			continue
		}
		seen := map[string]*yaml.Node{}
		for j := 0; j+1 < len(v.Content); j += 2 {
			sk, sv := v.Content[j], resolve(v.Content[j+1])
			name := k.Value + "." + sk.Value
			if sk.Kind != yaml.ScalarNode || !slices.Contains(keys, sk.Value) {
				fail(sk, "unknown setting %s; %s takes %s", quoteKey(sk), k.Value, strings.Join(keys, ", "))
				continue
			}
			if first, dup := seen[sk.Value]; dup {
				fail(sk, "%s is set twice; it is already set at line %d", name, first.Line)
				continue
			}
			seen[sk.Value] = sk
			switch {
			case isNull(sv):
			case listKeys[name] && sv.Kind == yaml.SequenceNode:
				var items []string
				for _, item := range sv.Content {
					if item = resolve(item); item.Kind != yaml.ScalarNode || isNull(item) {
						fail(item, "%s must be a list of single values", name)
						continue
					}
					items = append(items, item.Value)
				}
				if len(items) > 0 {
					out[name] = setting{items: items, file: file, line: sv.Line}
				}
			case listKeys[name]:
				fail(sv, "%s must be a list", name)
			case mappingKey(name) && sv.Kind == yaml.MappingNode:
				entries := map[string]string{}
				for e := 0; e+1 < len(sv.Content); e += 2 {
					ek, ev := resolve(sv.Content[e]), resolve(sv.Content[e+1])
					switch _, dup := entries[ek.Value]; {
					case ek.Kind != yaml.ScalarNode || ev.Kind != yaml.ScalarNode || isNull(ev):
						fail(ek, "%s must be a mapping of single values", name)
					case dup:
						fail(ek, "%s lists %s twice", name, quoteKey(ek))
					default:
						entries[ek.Value] = ev.Value
					}
				}
				if len(entries) > 0 {
					out[name] = setting{entries: entries, file: file, line: sv.Line}
				}
			case mappingKey(name):
				fail(sv, "%s must be a mapping", name)
			case sv.Kind != yaml.ScalarNode:
				fail(sv, "%s must be a single value, not a %s", name, kindName(sv))
			case sv.Value != "":
				// The text as written, whatever its YAML type: a token or a name that
				// happens to read as a number is still that text.
				out[name] = setting{value: sv.Value, file: file, line: sv.Line}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// resolve follows an alias to its anchor's node. Aliases are never expanded into copies,
// so an alias bomb costs nothing here.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	}
	return "YAML node"
}

// quoteKey names a key for a message. A key that is not a plain scalar is not repeated:
// a token pasted one line too far left would otherwise be quoted back.
func quoteKey(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode && len(n.Value) <= 64 {
		return strconv.Quote(n.Value)
	}
	return "at this line"
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// isParserProblem tells the problems of the YAML parser from those of its scanner: the
// parser numbers lines from 0 where the scanner numbers them from 1. Either leaves the
// number out on the first line.
func isParserProblem(msg string) bool {
	switch msg {
	case "did not find expected <stream-start>",
		"did not find expected <document start>",
		"did not find expected node content",
		"did not find expected key",
		"did not find expected '-' indicator",
		"did not find expected ',' or ']'",
		"did not find expected ',' or '}'",
		"found duplicate %YAML directive",
		"found duplicate %TAG directive",
		"found incompatible YAML document",
		"found undefined tag handle":
		return true
	}
	return false
}

// yamlError places a syntax error on its line. The parser's problems are fixed texts
// that quote nothing of the file; anything else is cut down to them so that a token
// next to a syntax error is not repeated.
func yamlError(file string, data []byte, err error) error {
	msg := err.Error()
	line := 1
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
		if isParserProblem(msg) {
			line++
		}
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	if n := bytes.Count(data, []byte{'\n'}) + 1; line > n {
		line = n
	}
	return fmt.Errorf("%s:%d: invalid YAML: %s", file, line, redactTokens(data, msg))
}

var tokenLine = regexp.MustCompile(`(?m)^\s*token\s*:\s*["']?([^\s"'#]+)`)

// redactTokens removes from msg anything that looks like the value of a token: key in
// data. The YAML library's messages do not quote values today; this keeps it so should
// a future version start to.
func redactTokens(data []byte, msg string) string {
	for _, m := range tokenLine.FindAllSubmatch(data, -1) {
		if len(m[1]) >= 4 {
			msg = strings.ReplaceAll(msg, string(m[1]), "[redacted]")
		}
	}
	return msg
}
