package gitsource

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// ErrUnverified is the error of an Update whose new head fails OpenPGP verification:
// the head is not applied, and the caller keeps what it reconciled last.
var ErrUnverified = errors.New("the head commit is not signed by a trusted key")

// VerificationError says which head failed verification and why, for the operator
// and for the commit status that reports it.
type VerificationError struct {
	Commit string
	// Reason is "unsigned", or what the check found wrong with the signature.
	Reason string
}

func (e *VerificationError) Error() string {
	return fmt.Sprintf("gitsource: head %s refused: %s", e.Commit, e.Reason)
}

func (e *VerificationError) Unwrap() error { return ErrUnverified }

// checkKeyRing parses an armored keyring once, so that a broken one is a configuration
// error at start rather than a refusal of every head.
func checkKeyRing(armored string) error {
	ring, err := openpgp.ReadArmoredKeyRing(strings.NewReader(armored))
	if err != nil {
		return fmt.Errorf("gitsource: the trusted OpenPGP keys cannot be read: %w", err)
	}
	if len(ring) == 0 {
		return errors.New("gitsource: the trusted OpenPGP keyring holds no key")
	}
	return nil
}

// verify checks c's signature against the trusted keys and names the signer.
func verify(c *object.Commit, armored string) (string, error) {
	if strings.TrimSpace(c.PGPSignature) == "" {
		return "", &VerificationError{Commit: c.Hash.String(), Reason: "the commit is not signed"}
	}
	signer, err := c.Verify(armored)
	if err != nil {
		return "", &VerificationError{Commit: c.Hash.String(), Reason: "the signature does not verify with a trusted key: " + err.Error()}
	}
	for name := range signer.Identities {
		return name, nil
	}
	return signer.PrimaryKey.KeyIdString(), nil
}
