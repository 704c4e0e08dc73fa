package servingca

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Options configure an Authority.
type Options struct {
	// Client reads and writes the Secret.
	Client client.Client
	// Secret is where the CA and the serving certificate are kept.
	Secret types.NamespacedName
	// Hosts are the DNS names and IP addresses the serving certificate is valid for:
	// those in the server URL of the kubeconfigs the hub writes.
	Hosts []string
	// CAValidity is a CA's life. Default one year.
	CAValidity time.Duration
	// CertValidity is the serving certificate's life. Default 30 days.
	CertValidity time.Duration
	// Overlap is how long a new CA is trusted before it signs. Default one day.
	Overlap time.Duration
	// Labels go on the Secret (ownership labels).
	Labels map[string]string
	Log    *slog.Logger
	Now    func() time.Time
}

// Authority serves the proxy's certificate and hands out the bundle that verifies it.
type Authority struct {
	opts   Options
	policy policy

	mu      sync.RWMutex
	cert    *tls.Certificate
	bundle  []byte
	onTrust []func([]byte)
}

// New checks the options; Reconcile loads or creates the CA.
func New(opts Options) (*Authority, error) {
	if opts.Client == nil || opts.Secret.Name == "" || opts.Secret.Namespace == "" {
		return nil, errors.New("servingca: a client and a Secret are required")
	}
	if len(opts.Hosts) == 0 {
		return nil, errors.New("servingca: the serving certificate needs at least one host")
	}
	if opts.CAValidity <= 0 {
		opts.CAValidity = 365 * 24 * time.Hour
	}
	if opts.CertValidity <= 0 {
		opts.CertValidity = 30 * 24 * time.Hour
	}
	if opts.Overlap <= 0 {
		opts.Overlap = 24 * time.Hour
	}
	if opts.Overlap >= opts.CAValidity/3 {
		return nil, fmt.Errorf("servingca: an overlap of %s leaves a CA due for rotation no time to take over (CA validity %s)", opts.Overlap, opts.CAValidity)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Authority{opts: opts, policy: policy{hosts: slices.Clone(opts.Hosts), caValidity: opts.CAValidity, certValidity: opts.CertValidity, overlap: opts.Overlap}}, nil
}

// OnTrustChange registers f to be called with the new bundle whenever it changes
// (also on the first Reconcile): the place that writes kubeconfigs rewrites them.
func (a *Authority) OnTrustChange(f func(bundle []byte)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.onTrust = append(a.onTrust, f)
}

// Bundle is the PEM of every CA a client should trust now; nil before the first
// Reconcile.
func (a *Authority) Bundle() []byte {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.bundle
}

// GetCertificate is the tls.Config hook that serves the current certificate.
func (a *Authority) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.cert == nil {
		return nil, errors.New("servingca: no serving certificate yet")
	}
	return a.cert, nil
}

// Reconcile reads the Secret, rotates what is due, writes it back and serves the
// result. A replica that lost a race for the Secret takes the winner's content.
func (a *Authority) Reconcile(ctx context.Context) error {
	var st state
	err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Steps: 5}, func(ctx context.Context) (bool, error) {
		var err error
		st, err = a.reconcileOnce(ctx)
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("the proxy's CA in Secret %s: %w", a.opts.Secret, err)
	}
	a.serve(st)
	return nil
}

func (a *Authority) reconcileOnce(ctx context.Context) (state, error) {
	var sec corev1.Secret
	err := a.opts.Client.Get(ctx, a.opts.Secret, &sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return state{}, err
	}
	exists := err == nil
	st, err := decode(sec.Data)
	if err != nil {
		return state{}, err
	}
	next, changed, err := rotate(st, a.opts.Now(), a.policy)
	if err != nil || !changed {
		return next, err
	}
	data, err := encode(next)
	if err != nil {
		return state{}, err
	}
	if !exists {
		sec = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: a.opts.Secret.Name, Namespace: a.opts.Secret.Namespace, Labels: a.opts.Labels}, Type: corev1.SecretTypeOpaque, Data: data}
		err = a.opts.Client.Create(ctx, &sec)
	} else {
		sec.Data = data
		// Update carries the resourceVersion read above: of two replicas rotating at
		// once, one fails with a conflict and reads the other's CA.
		err = a.opts.Client.Update(ctx, &sec)
	}
	if err != nil {
		return state{}, err
	}
	a.opts.Log.Info("the proxy's CA or serving certificate was rotated", "secret", a.opts.Secret.String(),
		"cas", len(next.cas), "signer", signing(next.cas, a.opts.Now(), a.policy.overlap).cert.Subject.CommonName, "servingUntil", next.serving.cert.NotAfter)
	return next, nil
}

// serve makes st what GetCertificate and Bundle answer.
func (a *Authority) serve(st state) {
	var bundle bytes.Buffer
	for _, ca := range st.cas {
		_ = pem.Encode(&bundle, &pem.Block{Type: pemCert, Bytes: ca.cert.Raw})
	}
	cert := &tls.Certificate{Certificate: [][]byte{st.serving.cert.Raw}, PrivateKey: st.serving.key, Leaf: st.serving.cert}
	a.mu.Lock()
	trustChanged := !bytes.Equal(a.bundle, bundle.Bytes())
	a.cert, a.bundle = cert, bundle.Bytes()
	hooks := slices.Clone(a.onTrust)
	a.mu.Unlock()
	if trustChanged {
		for _, f := range hooks {
			f(bundle.Bytes())
		}
	}
}

// Run reconciles every interval until ctx ends, logging failures: the certificate
// being served stays valid for long after a missed rotation.
func (a *Authority) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.Reconcile(ctx); err != nil {
				a.opts.Log.Error("rotating the proxy's certificates", "error", err)
			}
		}
	}
}
