package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
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

// checkValues reports the first value of n, in the document's order, that encoding/json
// has no value for: a scalar that yaml.v3 cannot resolve by its tag, such as !!int abc.
// A document is checked whole before any of its fields is.
func checkValues(n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return checkValues(n.Content[0])
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkValues(n.Content[i+1]); err != nil {
				return err
			}
		}
		return nil
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if err := checkValues(c); err != nil {
				return err
			}
		}
		return nil
	case yaml.ScalarNode:
		switch tag := n.ShortTag(); tag {
		case "!!bool", "!!int", "!!float":
			if _, plain := plainScalar(n, tag); !plain {
				var v any
				return n.Decode(&v)
			}
		}
		return nil
	}
	return unsupportedNode(n)
}

func unsupportedNode(n *yaml.Node) error {
	return fmt.Errorf("line %d: unsupported YAML node", n.Line)
}

// scalarValue converts a scalar to the value encoding/json knows, as yaml.v3 resolves it.
func scalarValue(n *yaml.Node) (any, error) {
	switch tag := n.ShortTag(); tag {
	case "!!null":
		return nil, nil
	case "!!bool", "!!int", "!!float":
		if text, plain := plainScalar(n, tag); plain {
			switch text {
			case "true":
				return true, nil
			case "false":
				return false, nil
			}
			return strconv.Atoi(text)
		}
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, err
		}
		return v, nil
	}
	return n.Value, nil
}

// plainScalar returns the JSON of a boolean or number that every cluster.yaml has, as
// yaml.v3 resolves it, without a decoder for each: true and false tagged (or resolved)
// !!bool and decimal integers of up to 18 digits tagged !!int, which are written as they
// are. plain is false for any other scalar, such as !!int true, which yaml.v3 refuses to
// decode. tag is n's short tag.
func plainScalar(n *yaml.Node, tag string) (text string, plain bool) {
	switch v := n.Value; {
	case tag == "!!bool" && (v == "true" || v == "false"):
		return v, true
	case tag == "!!int" && plainDecimal(v):
		return v, true
	}
	return "", false
}

// plainDecimal reports whether s is 0 or a decimal integer of up to 18 digits without
// a leading zero, sign or underscore, which yaml.v3 resolves to an int as strconv.Atoi
// does.
func plainDecimal(s string) bool {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || len(digits) > 18 || (digits[0] == '0' && s != "0") {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return false
		}
	}
	return true
}

var (
	unknownField   = regexp.MustCompile(`unknown field "([^"]+)"`)
	duplicateField = regexp.MustCompile(`duplicate field "([^"]+)"`)
	typeError      = regexp.MustCompile(`^json: cannot unmarshal (\S+) into Go struct field [^.]*\.(\S+) of type (\S+)`)
)

// decodeStrict decodes a mapping node into out, refusing unknown fields. Every error is
// placed at the node it concerns.
func decodeStrict(root *yaml.Node, out any, e errs) bool {
	if err := checkValues(root); err != nil {
		e.at(root.Line, root.Column, "%v", err)
		return false
	}
	return decodeValue(root, nil, out, e)
}

// jsonEdits are the changes a loader makes to a document before it is decoded, made as
// its JSON is written rather than to a copy of it.
type jsonEdits struct {
	// leftOut holds the value nodes whose mapping entries are left out, as if deleted; it
	// is made when the first one is.
	leftOut map[*yaml.Node]bool
	// asStrings is a mapping whose values are written as strings, each its node's text.
	asStrings *yaml.Node
}

// leaveOut leaves the mapping entry whose value is n out of the document.
func (ed *jsonEdits) leaveOut(n *yaml.Node) {
	if ed.leftOut == nil {
		ed.leftOut = map[*yaml.Node]bool{}
	}
	ed.leftOut[n] = true
}

func (ed *jsonEdits) isLeftOut(n *yaml.Node) bool { return ed != nil && ed.leftOut[n] }

func (ed *jsonEdits) writesAsStrings(m *yaml.Node) bool { return ed != nil && ed.asStrings == m }

// decodeValue decodes root, a document checked by checkValues, with the edits ed (which
// may be nil), into out.
func decodeValue(root *yaml.Node, ed *jsonEdits, out any, e errs) bool {
	// A cluster.yaml is a few hundred bytes of JSON.
	raw, err := appendNodeJSON(make([]byte, 0, 512), root, ed)
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

// appendNodeJSON appends n, with the edits ed, as json.Marshal writes the value a
// generic decoder makes of it: every mapping an object of string keys (a key's text,
// whatever its kind) in sorted order, the last entry of a key the one that counts; every
// sequence an array; every scalar what yaml.v3 resolves it to. So the decoder sees, and
// its errors name, what it did when the document was turned into maps first, without
// those maps, or the reflection json.Marshal spends on them, for every cluster.yaml.
func appendNodeJSON(b []byte, n *yaml.Node, ed *jsonEdits) ([]byte, error) {
	var err error
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return append(b, "null"...), nil
		}
		return appendNodeJSON(b, n.Content[0], ed)
	case yaml.MappingNode:
		return appendMappingJSON(b, n, ed)
	case yaml.SequenceNode:
		b = append(b, '[')
		for i, c := range n.Content {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendNodeJSON(b, c, ed); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case yaml.ScalarNode:
		switch tag := n.ShortTag(); tag {
		case "!!null":
			return append(b, "null"...), nil
		case "!!bool", "!!int", "!!float":
			if text, plain := plainScalar(n, tag); plain {
				return append(b, text...), nil
			}
			v, err := scalarValue(n)
			if err != nil {
				return nil, err
			}
			data, err := json.Marshal(v)
			if err != nil {
				return nil, err
			}
			return append(b, data...), nil
		}
		return appendJSONString(b, n.Value), nil
	}
	return nil, unsupportedNode(n)
}

func appendMappingJSON(b []byte, m *yaml.Node, ed *jsonEdits) ([]byte, error) {
	// The index of each entry's key, sorted by the key and then by place.
	var buf [16]int
	keys := buf[:0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		keys = append(keys, i)
	}
	slices.SortFunc(keys, func(i, j int) int {
		if c := strings.Compare(m.Content[i].Value, m.Content[j].Value); c != 0 {
			return c
		}
		return i - j
	})
	b = append(b, '{')
	first := true
	var err error
	for x, i := range keys {
		k, v := m.Content[i], m.Content[i+1]
		if x+1 < len(keys) && m.Content[keys[x+1]].Value == k.Value {
			continue // a later entry sets the key again
		}
		if ed.isLeftOut(v) {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, k.Value)
		b = append(b, ':')
		if ed.writesAsStrings(m) {
			b = appendJSONString(b, v.Value)
			continue
		}
		if b, err = appendNodeJSON(b, v, ed); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// appendJSONString appends s as json.Marshal writes it.
func appendJSONString(b []byte, s string) []byte {
	if !plainJSONString(s) {
		data, _ := json.Marshal(s) // a string always marshals
		return append(b, data...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// plainJSONString reports whether json.Marshal writes s as it is, between quotes:
// printable ASCII other than the quote, the backslash and <, > and &, which it escapes
// for HTML.
func plainJSONString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
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
