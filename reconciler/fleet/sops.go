package fleet

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// encryptedValue reports whether s is a value as SOPS writes it encrypted:
//
//	ENC[AES256_GCM,data:<base64>,iv:<base64>,tag:<base64>,type:<lower-case word>]
//
// with data possibly empty. Matched by hand rather than by a regular expression: every
// enrollment file of a fleet is checked at each full load, and the expression took a
// fortieth of the time of loading and rendering 10,000 clusters.
func encryptedValue(s string) bool {
	s, ok := strings.CutPrefix(s, "ENC[AES256_GCM,")
	if !ok {
		return false
	}
	if s, ok = strings.CutSuffix(s, "]"); !ok {
		return false
	}
	for i, f := range sopsFields {
		// No field's characters include a comma: each but the last ends at one.
		v, rest, more := strings.Cut(s, ",")
		if more != (i < len(sopsFields)-1) {
			return false
		}
		if v, ok = strings.CutPrefix(v, f.name); !ok || len(v) < f.min || !allOf(v, f.char) {
			return false
		}
		s = rest
	}
	return true
}

// sopsFields are the fields of an encrypted value, in SOPS's order.
var sopsFields = [...]struct {
	name string
	min  int
	char func(byte) bool
}{{"data:", 0, isBase64}, {"iv:", 1, isBase64}, {"tag:", 1, isBase64}, {"type:", 1, isLower}}

func isBase64(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '='
}

func isLower(c byte) bool { return 'a' <= c && c <= 'z' }

func allOf(s string, char func(byte) bool) bool {
	for i := range len(s) {
		if !char(s[i]) {
			return false
		}
	}
	return true
}

// sopsKeyGroups are the ways SOPS can record who may decrypt a file.
var sopsKeyGroups = []string{"age", "kms", "gcp_kms", "azure_kv", "hc_vault", "pgp", "key_groups"}

// checkSOPS checks that an enrollment file is structurally a SOPS file: it has SOPS
// metadata and every value is encrypted. It never decrypts, and it never repeats a value
// in a message: a plaintext value here is a token that must not reach a log.
func checkSOPS(data []byte, e errs) {
	root, ok := singleDocument(data, e)
	if !ok {
		return
	}
	metaKey, meta := lookup(root, "sops")
	if meta == nil || meta.Kind != yaml.MappingNode {
		e.at(root.Line, root.Column, "not a SOPS file: no sops metadata; encrypt the enrollment token with sops (`flotilla cluster add` does)")
		return
	}
	if _, mac := lookup(meta, "mac"); mac == nil || mac.Value == "" {
		e.at(metaKey.Line, metaKey.Column, "SOPS metadata has no mac; the file was not written by sops")
	}
	recipients := false
	for _, g := range sopsKeyGroups {
		if _, v := lookup(meta, g); v != nil && len(v.Content) > 0 {
			recipients = true
		}
	}
	if !recipients {
		e.at(metaKey.Line, metaKey.Column, "SOPS metadata names no recipient (age, KMS or PGP); the hub could never decrypt it")
	}
	encrypted := 0
	var walk func(n *yaml.Node, p []string)
	walk = func(n *yaml.Node, p []string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if len(p) == 0 && k.Value == "sops" {
					continue
				}
				walk(n.Content[i+1], append(p, k.Value))
			}
		case yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, p)
			}
		case yaml.ScalarNode:
			if encryptedValue(n.Value) {
				encrypted++
				return
			}
			e.at(n.Line, n.Column, "value of %s is not encrypted; an enrollment file must hold only SOPS-encrypted values", strings.Join(p, "."))
		}
	}
	walk(root, nil)
	if encrypted == 0 {
		e.at(root.Line, root.Column, "the enrollment file holds no encrypted value")
	}
}
