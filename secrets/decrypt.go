package secrets

import (
	"cmp"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/getsops/sops/v3"
	"github.com/getsops/sops/v3/aes"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/config"
	"github.com/getsops/sops/v3/keyservice"
	sopsyaml "github.com/getsops/sops/v3/stores/yaml"
	"go.yaml.in/yaml/v3"
	"golang.org/x/sync/singleflight"
	"k8s.io/utils/lru"
)

// MaxEnrollmentFileSize caps an enrollment file. One holds a token and a data key per
// recipient, a few KiB at most; anything larger is not worth parsing.
const MaxEnrollmentFileSize = 64 << 10

// What can be wrong with an enrollment file. A [FileError] wraps one of them, so callers
// can tell them apart with errors.Is; none of them carries the file's plaintext.
var (
	ErrTooLarge = errors.New("enrollment file is too large")
	// ErrMalformed: not YAML, no or a broken sops block, truncated, or not one token.
	ErrMalformed = errors.New("malformed enrollment file")
	// ErrNoIdentity: none of the hub's identities is a recipient of the file.
	ErrNoIdentity = errors.New("no identity can decrypt")
	// ErrIntegrity: a value or the MAC was changed after encryption.
	ErrIntegrity = errors.New("MAC check failed")
	// ErrKeyUnavailable: the data key could not be had, for a reason other than the
	// recipients, such as a KMS that is switched off or refused the request.
	ErrKeyUnavailable = errors.New("cannot decrypt the data key")
	// ErrToken: the decrypted value is not a well-formed enrollment token.
	ErrToken = errors.New("the encrypted value is not a valid enrollment token")
)

// FileError is a problem with one enrollment file.
type FileError struct {
	File string
	// Err is one of the sentinel errors above.
	Err error
	// Detail says more, for the fleet owner; it never holds plaintext.
	Detail string
}

func (e *FileError) Error() string { return e.File + ": " + e.Reason() }

// Reason is the error without the file's name.
func (e *FileError) Reason() string {
	if e.Detail == "" {
		return e.Err.Error()
	}
	return e.Err.Error() + ": " + e.Detail
}

func (e *FileError) Unwrap() error { return e.Err }

// DecryptorOptions configure a [Decryptor].
type DecryptorOptions struct {
	// Identities decrypt files encrypted to age recipients.
	Identities *Identities
	// KMS lets files encrypted to a cloud KMS or Vault be decrypted through SOPS's
	// local key service and its usual credential chain. Off, such files fail with
	// ErrKeyUnavailable instead of reaching out to a cloud.
	KMS bool
	// CacheSize bounds how many file hashes are remembered; zero means 65536.
	CacheSize int
	// KMSTimeout bounds each call to a KMS or Vault; zero means DefaultKMSTimeout.
	KMSTimeout time.Duration
}

// DefaultKMSTimeout bounds a call to a KMS when DecryptorOptions set none. SOPS hands its
// key services no deadline of the caller's, and a cloud's SDK may wait long: a KMS that
// does not answer must not hold a sync for longer.
const DefaultKMSTimeout = 30 * time.Second

// Decryptor turns enrollment files into token hashes inside the hub. It is safe for
// concurrent use, and it decrypts a given file content at most once: results are cached
// by the file's git blob hash, which is the same whether the file came from a commit or
// from a checkout.
type Decryptor struct {
	svc   keyService
	cache *lru.Cache
	group singleflight.Group
	// decryptions counts files actually decrypted, for metrics and for tests of the cache.
	decryptions atomic.Int64
	// recipientsText lists the hub's recipients for ErrNoIdentity's message.
	recipientsText string
}

// NewDecryptor holds the identities in memory behind SOPS's key-service interface.
func NewDecryptor(opts DecryptorOptions) *Decryptor {
	size := opts.CacheSize
	if size <= 0 {
		size = 1 << 16
	}
	recipients := "no age identity"
	if r := opts.Identities.Recipients(); len(r) > 0 {
		recipients = strings.Join(r, ", ")
	}
	return &Decryptor{
		svc:            keyService{ids: opts.Identities, kms: opts.KMS, local: keyservice.NewLocalClient(), timeout: cmp.Or(opts.KMSTimeout, DefaultKMSTimeout)},
		cache:          lru.New(size),
		recipientsText: recipients,
	}
}

// Decryptions is how many files the Decryptor has decrypted, cache misses only.
func (d *Decryptor) Decryptions() int64 { return d.decryptions.Load() }

// BlobHash is git's object name of a blob with this content, the key of the cache.
func BlobHash(data []byte) string {
	h := sha1.New()
	h.Write([]byte("blob " + strconv.Itoa(len(data)) + "\x00"))
	h.Write(data)
	return fmt.Sprintf("%x", h.Sum(nil))
}

// TokenHash decrypts the enrollment file data, read from file, verifies its MAC and
// returns the hash of the token inside. The plaintext never leaves this call.
func (d *Decryptor) TokenHash(ctx context.Context, file string, data []byte) (Hash, error) {
	if len(data) > MaxEnrollmentFileSize {
		return Hash{}, &FileError{File: file, Err: ErrTooLarge, Detail: fmt.Sprintf("%d bytes, at most %d", len(data), MaxEnrollmentFileSize)}
	}
	key := BlobHash(data)
	if h, ok := d.cache.Get(key); ok {
		return h.(Hash), nil
	}
	// Concurrent calls for the same content share one decryption; a failure is not
	// cached, because a KMS that refused once may answer the next time.
	v, err, _ := d.group.Do(key, func() (any, error) {
		if h, ok := d.cache.Get(key); ok {
			return h, nil
		}
		d.decryptions.Add(1)
		h, err := d.decrypt(ctx, data)
		if err != nil {
			return nil, err
		}
		d.cache.Add(key, h)
		return h, nil
	})
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			// Cut short (the hub stopping, or the caller that shared this call): nothing
			// is known of the file.
			return Hash{}, &FileError{File: file, Err: ErrKeyUnavailable, Detail: "the decryption was cut short: " + err.Error()}
		}
		var fe *FileError
		if errors.As(err, &fe) {
			// The shared call may have been made for another path with the same content.
			copy := *fe
			copy.File = file
			return Hash{}, &copy
		}
		return Hash{}, &FileError{File: file, Err: ErrMalformed, Detail: Redact(err.Error())}
	}
	return v.(Hash), nil
}

func (d *Decryptor) decrypt(ctx context.Context, data []byte) (h Hash, err error) {
	defer recoverInto(&err, "")
	if err := ctx.Err(); err != nil {
		return Hash{}, err
	}
	fail := func(sentinel error, format string, args ...any) (Hash, error) {
		return Hash{}, &FileError{Err: sentinel, Detail: Redact(fmt.Sprintf(format, args...))}
	}
	if detail := checkShape(data); detail != "" {
		return fail(ErrMalformed, "%s", detail)
	}
	tree, err := sopsyaml.NewStore(&config.NewStoresConfig().YAML).LoadEncryptedFile(data)
	if err != nil {
		return fail(ErrMalformed, "%v", err)
	}
	if len(tree.Metadata.KeyGroups) == 0 {
		return fail(ErrMalformed, "the sops block names no recipient")
	}

	call := &recordingKeyService{ctx: ctx, inner: &d.svc}
	dataKey, err := tree.Metadata.GetDataKeyWithKeyServices([]keyservice.KeyServiceClient{call}, nil)
	if err != nil {
		return d.dataKeyError(tree.Metadata, call.errs())
	}
	cipher := aes.NewCipher()
	mac, err := tree.Decrypt(dataKey, cipher)
	if err != nil {
		if strings.Contains(err.Error(), "Could not decrypt with AES_GCM") {
			return fail(ErrIntegrity, "an encrypted value was changed after the file was encrypted")
		}
		return fail(ErrMalformed, "%v", err)
	}
	fileMAC, err := cipher.Decrypt(tree.Metadata.MessageAuthenticationCode, dataKey, tree.Metadata.LastModified.Format(time.RFC3339))
	if err != nil {
		return fail(ErrIntegrity, "the MAC or the lastmodified time was changed after the file was encrypted")
	}
	if fileMAC != mac {
		return fail(ErrIntegrity, "the values do not match the MAC; the file was changed after it was encrypted")
	}

	var token string
	var keys []string
	for _, branch := range tree.Branches {
		for _, item := range branch {
			k, ok := item.Key.(string)
			if !ok {
				continue // a comment
			}
			keys = append(keys, k)
			if k == tokenKey {
				token, _ = item.Value.(string)
			}
		}
	}
	if len(tree.Branches) != 1 || !slices.Equal(keys, []string{tokenKey}) {
		return fail(ErrMalformed, "an enrollment file holds exactly one key, %q, in one document", tokenKey)
	}
	t, err := ParseToken(token)
	if err != nil {
		return fail(ErrToken, "%v", err)
	}
	return t.Hash(), nil
}

// checkShape looks at the YAML before SOPS does, so that the common ways a file goes
// wrong (cut short, hand-edited, never encrypted) get a message a fleet owner can act on
// instead of SOPS's internal one. It returns "" when the shape is right.
func checkShape(data []byte) string {
	var doc struct {
		Token yaml.Node `yaml:"token"`
		SOPS  yaml.Node `yaml:"sops"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "not YAML (" + err.Error() + "); the file may be truncated"
	}
	if doc.SOPS.Kind == 0 {
		return "no sops metadata; encrypt it with `flotilla cluster add` or `flotilla cluster rotate-token`"
	}
	if doc.SOPS.Kind != yaml.MappingNode {
		return fmt.Sprintf("line %d: the sops block is not a mapping", doc.SOPS.Line)
	}
	var missing []string
	for _, field := range []string{"mac", "lastmodified", "version"} {
		found := false
		for i := 0; i+1 < len(doc.SOPS.Content); i += 2 {
			if doc.SOPS.Content[i].Value == field && doc.SOPS.Content[i+1].Value != "" {
				found = true
			}
		}
		if !found {
			missing = append(missing, field)
		}
	}
	if len(missing) > 0 {
		return fmt.Sprintf("line %d: the sops block has no %s; the file is truncated or was not written by sops", doc.SOPS.Line, strings.Join(missing, ", "))
	}
	if doc.Token.Kind == yaml.ScalarNode && !strings.HasPrefix(doc.Token.Value, "ENC[") {
		return fmt.Sprintf("line %d: the token is not encrypted; remove the file, rotate the token and encrypt the new one", doc.Token.Line)
	}
	return ""
}

// dataKeyError explains why no master key of the file gave its data key.
func (d *Decryptor) dataKeyError(meta sops.Metadata, errs []error) (Hash, error) {
	var recipients []string
	for _, g := range meta.KeyGroups {
		for _, k := range g {
			if a, ok := k.(*sopsage.MasterKey); ok {
				recipients = append(recipients, a.Recipient)
			} else {
				recipients = append(recipients, k.TypeToIdentifier())
			}
		}
	}
	var other []error
	for _, err := range errs {
		if !errors.Is(err, errNoIdentity) {
			other = append(other, err)
		}
	}
	if len(other) == 0 {
		return Hash{}, &FileError{Err: ErrNoIdentity, Detail: Redact(fmt.Sprintf(
			"it is encrypted to %s; the hub holds %s", strings.Join(recipients, ", "), d.recipientsText))}
	}
	return Hash{}, &FileError{Err: ErrKeyUnavailable, Detail: Redact(errors.Join(other...).Error())}
}

// recordingKeyService keeps what each master key answered, because SOPS folds them into
// one error that cannot be taken apart. It also hands the caller's context to the key
// service, in place of the one SOPS makes.
type recordingKeyService struct {
	ctx   context.Context
	inner keyservice.KeyServiceClient
	mu    sync.Mutex
	seen  []error
}

func (r *recordingKeyService) errs() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}
