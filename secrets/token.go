// Package secrets handles enrollment tokens: it makes them, encrypts them with SOPS for
// the hub, decrypts them inside the hub with identities held in memory, and finds them
// where they must not be. A token's plaintext leaves this package only through
// [Token.Reveal], which the CLI uses to hand it to a worker's administrator; everything
// else sees a [Hash] or a fingerprint.
//
// The hub and the CLI import this package; the agent never does, so that SOPS and the
// hub's keys stay out of the worker's binary.
package secrets

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
)

// A token is TokenPrefix, then 32 random bytes and a CRC-32 of them, in lower-case
// base32 without padding: 64 characters in all, easy to find by pattern and to check for
// a typing error before anything is looked up.
const (
	TokenPrefix = "flt1_"
	tokenBytes  = 32
	tokenLen    = len(TokenPrefix) + (tokenBytes*8+4)/5 + (4*8+4)/5
)

var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Errors of [ParseToken]; they never repeat the text they were given.
var (
	ErrTokenFormat   = errors.New("not a flotilla enrollment token")
	ErrTokenChecksum = errors.New("enrollment token has a wrong checksum (mistyped or truncated)")
)

// Token is an enrollment token. Its String and GoString methods print only its
// fingerprint, so that a token passed to a logger or to fmt by mistake does not leak.
type Token struct{ s string }

// NewToken draws a token from crypto/rand.
func NewToken() (Token, error) {
	var b [tokenBytes + 4]byte
	if _, err := rand.Read(b[:tokenBytes]); err != nil {
		return Token{}, fmt.Errorf("generating an enrollment token: %w", err)
	}
	binary.BigEndian.PutUint32(b[tokenBytes:], crc32.ChecksumIEEE(b[:tokenBytes]))
	return Token{s: TokenPrefix + tokenEncoding.EncodeToString(b[:tokenBytes]) + tokenEncoding.EncodeToString(b[tokenBytes:])}, nil
}

// ParseToken checks the format and checksum of s.
func ParseToken(s string) (Token, error) {
	if len(s) != tokenLen || !strings.HasPrefix(s, TokenPrefix) {
		return Token{}, ErrTokenFormat
	}
	body := s[len(TokenPrefix):]
	split := (tokenBytes*8 + 4) / 5
	random, err1 := tokenEncoding.DecodeString(body[:split])
	sum, err2 := tokenEncoding.DecodeString(body[split:])
	if err1 != nil || err2 != nil || len(random) != tokenBytes || len(sum) != 4 {
		return Token{}, ErrTokenFormat
	}
	// Base32 can spell the same bytes in more than one way in its last character; only
	// the canonical spelling is a token, so that one token has one text and one hash.
	if tokenEncoding.EncodeToString(random) != body[:split] || tokenEncoding.EncodeToString(sum) != body[split:] {
		return Token{}, ErrTokenFormat
	}
	if binary.BigEndian.Uint32(sum) != crc32.ChecksumIEEE(random) {
		return Token{}, ErrTokenChecksum
	}
	return Token{s: s}, nil
}

// IsZero reports whether t is the zero Token.
func (t Token) IsZero() bool { return t.s == "" }

// Reveal returns the token's text. Only code that hands the token to its one reader,
// the agent's values file, calls it.
func (t Token) Reveal() string { return t.s }

// Hash is the token's SHA-256 digest, the only form in which the hub keeps it.
func (t Token) Hash() Hash { return sha256.Sum256([]byte(t.s)) }

// String prints the fingerprint, never the token.
func (t Token) String() string {
	if t.IsZero() {
		return "token(none)"
	}
	return "token(" + t.Hash().Fingerprint() + ")"
}

// GoString keeps %#v from printing the token's field.
func (t Token) GoString() string { return t.String() }

// Hash is the SHA-256 digest of a token.
type Hash [sha256.Size]byte

const hashPrefix = "sha256:"

// ParseHash reads the form [Hash.String] writes.
func ParseHash(s string) (Hash, error) {
	var h Hash
	hexPart, ok := strings.CutPrefix(s, hashPrefix)
	if !ok || len(hexPart) != hex.EncodedLen(len(h)) {
		return Hash{}, fmt.Errorf("token hash %q is not sha256:<64 hex digits>", s)
	}
	if _, err := hex.Decode(h[:], []byte(hexPart)); err != nil {
		return Hash{}, fmt.Errorf("token hash %q is not sha256:<64 hex digits>", s)
	}
	return h, nil
}

func (h Hash) String() string { return hashPrefix + hex.EncodeToString(h[:]) }

// IsZero reports whether h is the zero Hash, which no token hashes to in practice.
func (h Hash) IsZero() bool { return h == Hash{} }

// Fingerprint is a short prefix of the digest for logs and statuses: enough to tell
// tokens apart, far too little to help guess one.
func (h Hash) Fingerprint() string { return hex.EncodeToString(h[:6]) }

// Equal compares in constant time.
func (h Hash) Equal(o Hash) bool { return subtle.ConstantTimeCompare(h[:], o[:]) == 1 }

// Verify reports whether presented is a well-formed token whose hash is want. The error
// says why not, for the operator's log; the caller of an API must not be told.
func Verify(presented string, want Hash) error {
	t, err := ParseToken(presented)
	if err != nil {
		return err
	}
	if !t.Hash().Equal(want) {
		return ErrTokenMismatch
	}
	return nil
}

// ErrTokenMismatch is what [Verify] says of a well-formed token that is not the one expected.
var ErrTokenMismatch = errors.New("enrollment token does not match the one in the fleet repository")
