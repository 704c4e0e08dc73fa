package fleet

import (
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// sopsValue is how SOPS writes an encrypted value.
var sopsValue = regexp.MustCompile(`^ENC\[AES256_GCM,data:[A-Za-z0-9+/=]*,iv:[A-Za-z0-9+/=]+,tag:[A-Za-z0-9+/=]+,type:[a-z]+\]$`)

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
			if sopsValue.MatchString(n.Value) {
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
