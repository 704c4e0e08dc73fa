package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"filippo.io/age"
	"filippo.io/age/armor"
	"github.com/getsops/sops/v3/keyservice"
	"google.golang.org/grpc"
)

// maxDataKey bounds what one master key may decrypt to: SOPS data keys are 32 bytes.
const maxDataKey = 1024

// Reasons a master key could not give the data key, told apart so that the file's error
// can say what the operator should do.
var (
	errNoIdentity = errors.New("no identity of the hub matches this recipient")
	errKMSOff     = errors.New("decryption through a KMS is not enabled on this hub")
	errPGP        = errors.New("PGP keys are not supported; encrypt enrollment files to age recipients or a KMS")
)

// keyService is the SOPS key service the hub decrypts through. Age keys are opened with
// the identities in memory, so SOPS never reads a key file or an environment variable;
// KMS keys go to SOPS's own local service and its cloud credential chain, when allowed.
type keyService struct {
	ids   *Identities
	kms   bool
	local keyservice.KeyServiceClient
	// timeout bounds each call to local.
	timeout time.Duration
}

var _ keyservice.KeyServiceClient = (*keyService)(nil)

func (s *keyService) Decrypt(ctx context.Context, req *keyservice.DecryptRequest, opts ...grpc.CallOption) (*keyservice.DecryptResponse, error) {
	switch req.GetKey().GetKeyType().(type) {
	case *keyservice.Key_AgeKey:
		if s.ids.Len() == 0 {
			return nil, errNoIdentity
		}
		r, err := age.Decrypt(armor.NewReader(bytes.NewReader(req.GetCiphertext())), s.ids.ids...)
		if err != nil {
			var noMatch *age.NoIdentityMatchError
			if errors.As(err, &noMatch) {
				return nil, errNoIdentity
			}
			return nil, fmt.Errorf("the age-encrypted data key is corrupt: %w", err)
		}
		key, err := io.ReadAll(io.LimitReader(r, maxDataKey+1))
		if err != nil {
			return nil, fmt.Errorf("the age-encrypted data key is corrupt: %w", err)
		}
		if len(key) > maxDataKey {
			return nil, errors.New("the age-encrypted data key is too long")
		}
		return &keyservice.DecryptResponse{Plaintext: key}, nil
	case *keyservice.Key_PgpKey:
		return nil, errPGP
	default:
		if !s.kms {
			return nil, errKMSOff
		}
		return s.decryptBounded(ctx, req, opts...)
	}
}

// decryptBounded is local's Decrypt, given up when ctx ends or after timeout: SOPS's local
// service passes no context to the cloud's SDK, whose call may outlive this one.
func (s *keyService) decryptBounded(ctx context.Context, req *keyservice.DecryptRequest, opts ...grpc.CallOption) (*keyservice.DecryptResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	type answer struct {
		resp *keyservice.DecryptResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := s.local.Decrypt(ctx, req, opts...)
		done <- answer{resp, err}
	}()
	select {
	case a := <-done:
		return a.resp, a.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("the key service did not answer within %s", s.timeout)
		}
		return nil, ctx.Err()
	}
}

// Encrypt is never called by the hub: encryption happens in the CLI, which uses SOPS's
// local key service directly.
func (s *keyService) Encrypt(ctx context.Context, req *keyservice.EncryptRequest, opts ...grpc.CallOption) (*keyservice.EncryptResponse, error) {
	return nil, errors.New("the hub's key service does not encrypt")
}

func (r *recordingKeyService) Decrypt(_ context.Context, req *keyservice.DecryptRequest, opts ...grpc.CallOption) (*keyservice.DecryptResponse, error) {
	resp, err := r.inner.Decrypt(r.ctx, req, opts...)
	if err != nil {
		r.mu.Lock()
		r.seen = append(r.seen, err)
		r.mu.Unlock()
	}
	return resp, err
}

func (r *recordingKeyService) Encrypt(ctx context.Context, req *keyservice.EncryptRequest, opts ...grpc.CallOption) (*keyservice.EncryptResponse, error) {
	return r.inner.Encrypt(ctx, req, opts...)
}
