package fleet

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"go.yaml.in/yaml/v3"
)

// mapValue is what the loader decoded before appendNodeJSON: the document turned into
// maps, lists and scalars, each mapping's keys their text, the last entry of a key the
// one that counts, and the first error of a scalar in the document's order.
func mapValue(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return mapValue(n.Content[0])
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := mapValue(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := mapValue(c)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return s, nil
	case yaml.ScalarNode:
		// As the loader did, and not through scalarValue, which is what is tested.
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

func parseNode(t *testing.T, doc string) *yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
		t.Fatalf("%q: %v", doc, err)
	}
	return &n
}

// TestAppendNodeJSONWritesWhatEncodingJSONWritesOfTheMaps pins what decodeValue hands
// the decoder to json.Marshal's bytes of the document turned into maps, and checkValues
// to the error that turning it into maps meets first.
func TestAppendNodeJSONWritesWhatEncodingJSONWritesOfTheMaps(t *testing.T) {
	for _, doc := range []string{
		"", "a: 1", "{}", "[]", "null", "a:", "a: ~", "a: null",
		"b: 2\na: 1\nc: {z: 1, y: [3, 2, {x: []}]}\n",
		"t: true\nf: false\ny: yes\nT: True\nn: -42\nz: 0\nbig: 1234567890123456789\nhuge: 99999999999999999999\noct: 010\nhex: 0x1F\nu: 1_000\np: +3\nm0: -0\n",
		"f: 1.5\ng: -2.25e-7\nh: 1e21\ni: 123456789.125\nj: 1.0\nk: .5\n",
		"inf: .inf\nnan: .nan\n", "b: .nan\na: -.inf\n",
		"s: plain\nq: 'quote \" and \\ backslash'\nh: <html> & co\nc: \"tab\\tnew\\nline\\r\\x1f\\x7f\"\nu: ünïcødé\nl: \"\\u2028\\u2029\"\n",
		"\"<k>\": 1\n\"é\": 2\n\"\": 3\n\"a\\\"b\": 4\n",
		"? [a]\n: 1\n? {b: 2}\n: 2\nc: 3\n", "? [a]\n: 1\n\"\": 0\n",
		"'1': a\n2: b\ntrue: c\n~: d\n",
		"a: !!str 12\nb: !!int 12\nc: !!float 3\nd: !!bool true\ne: !!binary aGk=\nf: 2001-12-14\ng: !!timestamp 2001-12-14\nh: !custom x\n",
		"a: !!int abc\n", "x: [1, !!float abc]\na: !!int abc\n", "a: !!bool nope\n", "a: !!int true\n", "a: !!float false\n", "a: !!int 1.5\n",
		"a: !!bool \"true\"\nb: !!int '12'\n", "a: !!float 12\n",
		"list:\n  - - 1\n    - []\n  - {}\n  - ''\n",
	} {
		n := parseNode(t, doc)
		v, wantErr := mapValue(n)
		if err := checkValues(n); fmt.Sprint(err) != fmt.Sprint(wantErr) {
			t.Errorf("%q: checkValues gives %v, turning it into maps %v", doc, err, wantErr)
		}
		if wantErr != nil {
			continue
		}
		want, wantErr := json.Marshal(v)
		got, err := appendNodeJSON(nil, n, nil)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) || !bytes.Equal(got, want) {
			t.Errorf("%q: got %s (%v), encoding/json writes %s (%v)", doc, got, err, want, wantErr)
		}
	}
}

// TestAppendNodeJSONMakesTheEditsTheLoaderMadeToTheMaps pins jsonEdits to the edits
// decodeCluster made to the document's maps: a quota entry deleted, or set to its text.
func TestAppendNodeJSONMakesTheEditsTheLoaderMadeToTheMaps(t *testing.T) {
	doc := `spec:
  credentialLifetime: 90d
  zone: a
  quota:
    cpu: 8
    bad: [1]
    memory: 64Gi
    ? [x]
    : 1
    ? [y]
    : 2
    gpu: 1.5
    flag: true
    none: ~
    dup: 1
  other:
    cpu: 8
`
	// The entries of a key, in order, each kept or not: the last one decides.
	for _, keep := range []map[string][]bool{
		{},
		{"bad": {false}, "": {false, false}, "none": {false}, "flag": {false}},
		{"": {true, false}, "cpu": {false}, "gpu": {false}},
		{"": {false, true}, "dup": {false}},
	} {
		n := parseNode(t, doc)
		root := n.Content[0]
		v, err := mapValue(root)
		if err != nil {
			t.Fatal(err)
		}
		spec := v.(map[string]any)["spec"].(map[string]any)
		q := spec["quota"].(map[string]any)
		quota := valueAt(root, "spec", "quota")
		edits := jsonEdits{asStrings: quota}
		seen := map[string]int{}
		for i := 0; i+1 < len(quota.Content); i += 2 {
			k, val := quota.Content[i], quota.Content[i+1]
			kept := true
			if ks := keep[k.Value]; seen[k.Value] < len(ks) {
				kept = ks[seen[k.Value]]
			}
			seen[k.Value]++
			if kept {
				q[k.Value] = val.Value
			} else {
				delete(q, k.Value)
				edits.leaveOut(val)
			}
		}
		delete(spec, "credentialLifetime")
		edits.leaveOut(valueAt(root, "spec", "credentialLifetime"))
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendNodeJSON(nil, root, &edits)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%v: got %s (%v), the edited maps are %s", keep, got, err, want)
		}
	}
}

// TestAppendJSONStringWritesWhatEncodingJSONWrites pins appendJSONString to json.Marshal
// on every string a file may hold.
func TestAppendJSONStringWritesWhatEncodingJSONWrites(t *testing.T) {
	for _, s := range []string{
		"", "plain", `quote " and \ backslash`, "<html> & co", "tab\tnew\nline\r\x00\x1f\x7f",
		"ünïcødé", "\u2028\u2029", "bad \xff utf-8",
	} {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString([]byte("x"), s); !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Errorf("%q: got %s, encoding/json writes x%s", s, got, want)
		}
	}
}

// TestScalarValueResolvesScalarsAsYAMLDoes pins scalarValue's shortcut for booleans and
// integers to what yaml.v3 resolves them to.
func TestScalarValueResolvesScalarsAsYAMLDoes(t *testing.T) {
	for _, s := range []string{
		"true", "false", "True", "FALSE", "0", "7", "-7", "010", "0x1F", "0o17", "+3", "1_000",
		"123456789012345678", "1234567890123456789", "99999999999999999999", "-0", "1.5", ".inf",
		"!!int 12", "!!bool true", `!!int "12"`, "!!float 3", "1e3",
		"!!int true", "!!float false", `!!bool "true"`, "!!float 12",
	} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte("v: "+s), &doc); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		n := doc.Content[0].Content[1]
		got, gotErr := scalarValue(n)
		var want any
		wantErr := n.Decode(&want)
		switch n.ShortTag() {
		case "!!bool", "!!int", "!!float":
		default:
			want, wantErr = n.Value, nil
			if n.ShortTag() == "!!null" {
				want = nil
			}
		}
		if (gotErr != nil) != (wantErr != nil) || got != want {
			t.Errorf("%s: scalarValue gives %#v (%v), yaml.v3 %#v (%v)", s, got, gotErr, want, wantErr)
		}
	}
}
