package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// writeFileAtomic replaces path with data in one rename, so that an interrupted command
// leaves either the old file or the new one, and creates it with mode perm from the
// start: a token never sits in a file that others can read, not even for a moment.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// yamlScalar spells s as a one-line YAML scalar, quoted only where YAML needs it.
func yamlScalar(s string) string {
	out, err := yaml.Marshal(s)
	if err != nil {
		return strconv.Quote(s)
	}
	return strings.TrimSuffix(string(out), "\n")
}

// setScalar replaces the one-line scalar at path (mapping keys, or "0" for a sequence
// index) in a YAML document with the string value, keeping every other byte: comments and
// layout of a template survive the edit.
func setScalar(data []byte, value string, path ...string) ([]byte, error) {
	return setRawScalar(data, yamlScalar(value), path...)
}

// setRawScalar is setScalar with the value spelt by the caller, e.g. an unquoted true.
func setRawScalar(data []byte, raw string, path ...string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) != 1 {
		return nil, fmt.Errorf("not a single YAML document")
	}
	n := doc.Content[0]
	for _, key := range path {
		switch n.Kind {
		case yaml.MappingNode:
			var next *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == key {
					next = n.Content[i+1]
				}
			}
			if next == nil {
				return nil, fmt.Errorf("no %s", strings.Join(path, "."))
			}
			n = next
		case yaml.SequenceNode:
			i, err := strconv.Atoi(key)
			if err != nil || i < 0 || i >= len(n.Content) {
				return nil, fmt.Errorf("no %s", strings.Join(path, "."))
			}
			n = n.Content[i]
		default:
			return nil, fmt.Errorf("no %s", strings.Join(path, "."))
		}
	}
	if n.Kind != yaml.ScalarNode || n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return nil, fmt.Errorf("%s is not a one-line value", strings.Join(path, "."))
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	line := lines[n.Line-1]
	start := n.Column - 1
	end := len(bytes.TrimRight(line, "\r\n"))
	// A trailing comment on the line stays, and so does the space before it.
	if i := bytes.Index(line[start:end], []byte(" #")); i >= 0 {
		end = start + len(bytes.TrimRight(line[start:start+i], " \t"))
	}
	lines[n.Line-1] = append(append(append([]byte{}, line[:start]...), raw...), line[end:]...)
	return bytes.Join(lines, nil), nil
}
