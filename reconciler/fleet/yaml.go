package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	kjson "sigs.k8s.io/json"
)

// checkText rejects what no YAML file of a fleet may contain, before any parser sees it.
func checkText(data []byte, e errs) bool {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		line, col := position(data, i)
		e.at(line, col, "file contains a NUL byte; fleet files must be UTF-8 text")
		return false
	}
	if !utf8.Valid(data) {
		i := 0
		for i < len(data) {
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			i += size
		}
		line, col := position(data, i)
		e.at(line, col, "file is not valid UTF-8")
		return false
	}
	return true
}

// position turns a byte offset into a 1-based line and column (in runes).
func position(data []byte, off int) (line, col int) {
	before := data[:off]
	line = bytes.Count(before, []byte{'\n'}) + 1
	start := bytes.LastIndexByte(before, '\n') + 1
	return line, utf8.RuneCount(before[start:]) + 1
}

var yamlLineErr = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseYAML parses the documents of a YAML file into nodes without expanding anything.
// Anchors and aliases are refused outright: no fleet file needs them, and refusing them
// before decoding is what keeps an alias bomb from costing time or memory.
func parseYAML(data []byte, e errs) ([]*yaml.Node, bool) {
	if !checkText(data, e) {
		return nil, false
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if m := unknownAnchor.FindStringSubmatch(err.Error()); m != nil {
				// An alias of an anchor yet to come. The anchor's name is not repeated: in
				// an enrollment file it could be a token pasted in the wrong place.
				reportAlias(data, m[1], e)
				return nil, false
			}
			reportYAMLError(err, e)
			return nil, false
		}
		docs = append(docs, &n)
	}
	ok := true
	for _, d := range docs {
		reported := 0
		walkNodes(d, func(n *yaml.Node) bool {
			if reported >= maxNodeErrors {
				return false
			}
			if n.Kind == yaml.AliasNode || n.Anchor != "" {
				// One is enough: a file made of aliases would otherwise cost an error each.
				e.at(n.Line, n.Column, "YAML anchors and aliases are not allowed in fleet files")
				ok = false
				reported = maxNodeErrors
				return false
			}
			if n.Kind == yaml.MappingNode {
				first := map[string]*yaml.Node{}
				for i := 0; i+1 < len(n.Content) && reported < maxNodeErrors; i += 2 {
					k := n.Content[i]
					if k.Kind != yaml.ScalarNode {
						continue
					}
					if f, dup := first[k.Value]; dup {
						e.at(k.Line, k.Column, "duplicate key %q; it is already set at line %d", k.Value, f.Line)
						ok = false
						reported++
						continue
					}
					first[k.Value] = k
				}
			}
			return true
		})
	}
	return docs, ok
}

// maxNodeErrors bounds how many problems parseYAML reports for one document.
const maxNodeErrors = 10

var unknownAnchor = regexp.MustCompile(`unknown anchor '(.*)' referenced`)

// reportAlias places an alias whose anchor the parser had not seen at its first use.
func reportAlias(data []byte, name string, e errs) {
	const msg = "YAML anchors and aliases are not allowed in fleet files"
	if i := bytes.Index(data, []byte("*"+name)); i >= 0 {
		line, col := position(data, i)
		e.at(line, col, msg)
		return
	}
	e.whole(msg)
}

func reportYAMLError(err error, e errs) {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		for _, m := range te.Errors {
			reportYAMLMessage(m, e)
		}
		return
	}
	reportYAMLMessage(err.Error(), e)
}

// yamlParserProblems are the problems of the YAML parser, as opposed to its scanner. The
// parser numbers their lines from 0 and leaves the number out on the first line.
var yamlParserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"did not find expected node content":     true,
	"did not find expected key":              true,
	"did not find expected '-' indicator":    true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"found duplicate %YAML directive":        true,
	"found duplicate %TAG directive":         true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

func reportYAMLMessage(msg string, e errs) {
	if m := yamlLineErr.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		if yamlParserProblems[m[2]] {
			line++
		}
		e.at(line, 0, "invalid YAML: %s", m[2])
		return
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	if yamlParserProblems[msg] {
		e.at(1, 0, "invalid YAML: %s", msg)
		return
	}
	e.whole("invalid YAML: %s", msg)
}

func walkNodes(n *yaml.Node, fn func(*yaml.Node) bool) {
	if !fn(n) {
		return
	}
	for _, c := range n.Content {
		walkNodes(c, fn)
	}
}

// singleDocument parses a file that must hold exactly one YAML mapping.
func singleDocument(data []byte, e errs) (*yaml.Node, bool) {
	docs, ok := parseYAML(data, e)
	if !ok {
		return nil, false
	}
	if len(docs) == 0 || len(docs[0].Content) == 0 {
		e.whole("file is empty")
		return nil, false
	}
	if len(docs) > 1 {
		e.at(docs[1].Line, docs[1].Column, "file must hold a single YAML document; a second one starts here")
		return nil, false
	}
	root := docs[0].Content[0]
	if root.Kind != yaml.MappingNode {
		e.at(root.Line, root.Column, "expected a YAML mapping at the top of the file")
		return nil, false
	}
	return root, true
}

// toValue converts a node to the values encoding/json knows, keeping every mapping key a
// string as JSON (and Kubernetes) wants.
func toValue(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return toValue(n.Content[0])
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := toValue(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := toValue(c)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return s, nil
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, nil
		case "!!bool", "!!int", "!!float":
			var v any
			if err := n.Decode(&v); err != nil {
				return nil, err
			}
			return v, nil
		default:
			return n.Value, nil
		}
	}
	return nil, fmt.Errorf("line %d: unsupported YAML node", n.Line)
}

var (
	unknownField   = regexp.MustCompile(`unknown field "([^"]+)"`)
	duplicateField = regexp.MustCompile(`duplicate field "([^"]+)"`)
	typeError      = regexp.MustCompile(`^json: cannot unmarshal (\S+) into Go struct field [^.]*\.(\S+) of type (\S+)`)
)

// decodeStrict decodes a mapping node into out, refusing unknown fields. Every error is
// placed at the node it concerns.
func decodeStrict(root *yaml.Node, out any, e errs) bool {
	v, err := toValue(root)
	if err != nil {
		e.at(root.Line, root.Column, "%v", err)
		return false
	}
	return decodeValue(root, v, out, e)
}

func decodeValue(root *yaml.Node, v any, out any, e errs) bool {
	raw, err := json.Marshal(v)
	if err != nil {
		e.at(root.Line, root.Column, "%v", err)
		return false
	}
	strict, err := kjson.UnmarshalStrict(raw, out)
	ok := true
	for _, s := range strict {
		msg := s.Error()
		if m := unknownField.FindStringSubmatch(msg); m != nil {
			n := locate(root, splitPath(m[1])...)
			e.at(n.Line, n.Column, "unknown field %q", m[1])
		} else if m := duplicateField.FindStringSubmatch(msg); m != nil {
			n := locate(root, splitPath(m[1])...)
			e.at(n.Line, n.Column, "duplicate field %q", m[1])
		} else {
			e.at(root.Line, root.Column, "%s", msg)
		}
		ok = false
	}
	if err != nil {
		if m := typeError.FindStringSubmatch(err.Error()); m != nil {
			n := locate(root, splitPath(m[2])...)
			e.at(n.Line, n.Column, "%s: expected %s, got %s", m[2], jsonKind(m[3]), m[1])
		} else {
			e.at(root.Line, root.Column, "%s", strings.TrimPrefix(err.Error(), "json: "))
		}
		ok = false
	}
	return ok
}

func jsonKind(goType string) string {
	switch {
	case goType == "bool":
		return "true or false"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map"):
		return "a mapping"
	}
	return "a mapping"
}

// splitPath splits a JSON field path such as spec.expectedGPUs[0].count.
func splitPath(p string) []string {
	var out []string
	for _, part := range strings.Split(p, ".") {
		for {
			i := strings.IndexByte(part, '[')
			if i < 0 {
				break
			}
			if i > 0 {
				out = append(out, part[:i])
			}
			j := strings.IndexByte(part, ']')
			if j < i {
				break
			}
			out = append(out, part[i:j+1])
			part = part[j+1:]
		}
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

// locate finds the node a path names: the key of a mapping entry, the item "[i]" of a
// sequence. Where the path leaves the document it returns the deepest node it reached,
// which is where the missing piece belongs.
func locate(n *yaml.Node, path ...string) *yaml.Node {
	cur := n
	for i, seg := range path {
		switch cur.Kind {
		case yaml.MappingNode:
			key, val := lookup(cur, seg)
			if key == nil {
				return cur
			}
			if i == len(path)-1 {
				return key
			}
			cur = val
		case yaml.SequenceNode:
			idx, err := strconv.Atoi(strings.Trim(seg, "[]"))
			if err != nil || idx < 0 || idx >= len(cur.Content) {
				return cur
			}
			cur = cur.Content[idx]
		default:
			return cur
		}
	}
	return cur
}

// lookup returns the key and value nodes of a mapping entry.
func lookup(m *yaml.Node, key string) (k, v *yaml.Node) {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i], m.Content[i+1]
		}
	}
	return nil, nil
}

// valueAt returns the value node a path names, or nil.
func valueAt(n *yaml.Node, path ...string) *yaml.Node {
	cur := n
	for _, seg := range path {
		switch cur.Kind {
		case yaml.MappingNode:
			_, cur = lookup(cur, seg)
		case yaml.SequenceNode:
			idx, err := strconv.Atoi(strings.Trim(seg, "[]"))
			if err != nil || idx < 0 || idx >= len(cur.Content) {
				return nil
			}
			cur = cur.Content[idx]
		default:
			return nil
		}
		if cur == nil {
			return nil
		}
	}
	return cur
}
