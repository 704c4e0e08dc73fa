package secrets

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"

	"filippo.io/age"
)

// MaxIdentityFileSize bounds an age key file; one holds a few lines per key.
const MaxIdentityFileSize = 1 << 20

// Identities are the hub's age identities, held in memory for the life of the process.
// They are never written anywhere and never put into the environment.
type Identities struct {
	ids        []age.Identity
	recipients []string
}

// ParseIdentities reads age identities in the format of age-keygen's key files: one
// AGE-SECRET-KEY per line, blank lines and # comments ignored. source names the input in
// errors (a file name, or a Secret's namespace/name); the key material is never repeated.
func ParseIdentities(source string, r io.Reader) (*Identities, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxIdentityFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading age identities from %s: %w", source, err)
	}
	if len(data) > MaxIdentityFileSize {
		return nil, fmt.Errorf("age identities in %s: larger than %d bytes", source, MaxIdentityFileSize)
	}
	parsed, err := age.ParseIdentities(bytes.NewReader(data))
	if err != nil {
		// age's message can quote a malformed line, which may be most of a secret key.
		return nil, fmt.Errorf("age identities in %s: not an age key file (expected lines starting with AGE-SECRET-KEY-)", source)
	}
	ids := &Identities{}
	for _, id := range parsed {
		if err := ids.add(id); err != nil {
			return nil, fmt.Errorf("age identities in %s: %w", source, err)
		}
	}
	return ids, nil
}

// NewIdentities holds the given identities; a test or a caller that generated its own
// keys uses it instead of a key file.
func NewIdentities(list ...age.Identity) (*Identities, error) {
	ids := &Identities{}
	for _, id := range list {
		if err := ids.add(id); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

func (ids *Identities) add(id age.Identity) error {
	var recipient string
	switch id := id.(type) {
	case *age.X25519Identity:
		recipient = id.Recipient().String()
	case *age.HybridIdentity:
		recipient = id.Recipient().String()
	default:
		// Only native identities are accepted: plugin and passphrase identities would
		// run programs or prompt, and the hub must decrypt with nothing but memory.
		return errors.New("only native age X25519 and post-quantum hybrid identities are supported")
	}
	ids.ids = append(ids.ids, id)
	ids.recipients = append(ids.recipients, recipient)
	return nil
}

// Recipients are the public keys of the identities, for messages and for .sops.yaml.
func (ids *Identities) Recipients() []string {
	if ids == nil {
		return nil
	}
	return slices.Clone(ids.recipients)
}

// Len is the number of identities.
func (ids *Identities) Len() int {
	if ids == nil {
		return 0
	}
	return len(ids.ids)
}
