package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Every replica of a hub serves the API proxy, though only the leader holds the agents'
// tunnels: a replica that holds no tunnel to a worker relays the request to the leader's
// proxy. Kueue v0.17.0 may evict admitted work when one of its watches to a worker ends
// (kueue#12999), and a watch ends with the process that serves it. A watch a standby
// relays outlives the leader: the standby resumes it from the last resourceVersion it
// passed on, through whichever replica leads next (itself, once the agents redial to
// it). A watch the leaving replica held ends, and Kueue dials again at once; a replica
// answers it at once, without waiting for a leader, if the worker was connected when
// the last leader saw it (relayHoldsFor), so that Kueue counts the worker as reached
// within milliseconds, not after its reconnect backoff of seconds.

// relayedHeader marks a request one replica relayed to another: it is served by the
// replica it reached and never relayed again, so that a leader reached through its own
// Service while it does not know yet that it leads cannot relay to itself for ever.
const relayedHeader = "X-Flotilla-Relayed"

// relayRetry is how often a watch whose upstream broke asks the leader again: the
// Lease's move is seen nowhere else by a standby.
const relayRetry = 500 * time.Millisecond

// relay reaches the leading replica's API proxy.
type relay struct {
	base  *url.URL
	trust func() []byte

	mu        sync.Mutex
	bundle    []byte
	transport *http.Transport
	forward   *httputil.ReverseProxy
}

func newRelay(opts ProxyOptions) (*relay, error) {
	if opts.Leader == "" {
		return nil, nil
	}
	u, err := url.Parse(opts.Leader)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("tunnel: the leader's proxy %q is not an https URL", opts.Leader)
	}
	if opts.LeaderTrust == nil {
		return nil, errors.New("tunnel: relaying to the leader's proxy needs the bundle that verifies it")
	}
	return &relay{base: u, trust: opts.LeaderTrust}, nil
}

// client is the transport to the leader, made again when the proxy's CA bundle
// changed: a rotation is trusted from the next dial on.
func (r *relay) client() (*http.Transport, *httputil.ReverseProxy, error) {
	bundle := r.trust()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.transport != nil && string(bundle) == string(r.bundle) {
		return r.transport, r.forward, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return nil, nil, errors.New("no CA yet to verify the leader's proxy")
	}
	if r.transport != nil {
		r.transport.CloseIdleConnections()
	}
	r.bundle = bundle
	// HTTP/2: the watches of every worker a standby relays share a few connections.
	r.transport = &http.Transport{
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	r.forward = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(r.base)
			pr.Out.Host = ""
			// The caller's token goes along: the leader checks it again.
			pr.Out.Header.Set(relayedHeader, "1")
		},
		Transport:     r.transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			if failed, ok := req.Context().Value(relayFailedKey{}).(*bool); ok {
				*failed = true // the caller decides what to answer
				return
			}
			writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "the worker is not reachable through its tunnel")
		},
	}
	return r.transport, r.forward, nil
}

// openWatch sends the watch to the leader's proxy and reads the answer's header.
func (r *relay) openWatch(ctx context.Context, in *http.Request, identity string, target *url.URL) (*http.Response, error) {
	transport, _, err := r.client()
	if err != nil {
		return nil, err
	}
	u := *r.base
	u.Path = ProxyPathPrefix + identity + target.Path
	u.RawPath = ProxyPathPrefix + identity + target.EscapedPath()
	u.RawQuery = target.RawQuery
	out, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	out.Header = in.Header.Clone()
	out.Header.Set(relayedHeader, "1")
	out.Header.Del("Accept-Encoding")
	if acceptsJSON(in.Header.Values("Accept")) {
		out.Header.Set("Accept", "application/json")
	}
	return transport.RoundTrip(out)
}

// relayFailedKey holds, in a relayed request's context, where the relay notes that the
// leader could not be reached.
type relayFailedKey struct{}

// relayed reports whether another replica relayed r here.
func relayed(r *http.Request) bool { return r.Header.Get(relayedHeader) != "" }

// relayHoldsFor reports whether a watch to the identity's worker, which no replica can
// reach now, is held open rather than refused: only while the last leader saw the
// worker's agent connected and the cluster is still in the fleet. A worker that is
// gone is refused at once, so that Kueue counts it as lost and its work moves on
// after workerLostTimeout, as without a relay.
func (p *Proxy) relayHoldsFor(ctx context.Context, identity string) bool {
	if p.relay == nil {
		return false
	}
	wc, err := p.srv.lookup(ctx, identity, "")
	if err != nil {
		return false
	}
	return apimeta.IsStatusConditionTrue(wc.Status.Conditions, v1alpha1.ConditionConnected)
}
