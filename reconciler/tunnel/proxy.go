package tunnel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/reconciler/logbudget"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// ProxyPathPrefix starts every path of the API proxy: /clusters/<identity>/<API path>.
const ProxyPathPrefix = "/clusters/"

// ProxyURL is the server URL of identity's worker behind the proxy at base
// (https://host:port), as the kubeconfig Kueue reads names it.
func ProxyURL(base, identity string) string {
	return strings.TrimSuffix(base, "/") + ProxyPathPrefix + identity
}

// upstreamHost stands for an identity's worker in the proxy's outbound requests; the
// dialer maps it back to the identity's tunnel. It resolves nowhere.
const upstreamHost = ".worker.flotilla.invalid"

// ProxyOptions configure the API proxy.
type ProxyOptions struct {
	// MaxBodyBytes caps a request body. Default 3 MiB, the API server's own cap.
	MaxBodyBytes int64
	// MaxInFlight caps the requests, watches included, open to one worker at once;
	// more are answered 429. Default 64.
	MaxInFlight int
	// ResumeWindow is how long a watch waits for its agent to redial before it ends:
	// a tunnel blip shorter than this is invisible to the watcher, since the watch
	// resumes from the last resourceVersion it passed on. Default 60 s.
	ResumeWindow time.Duration
	// Leader is the API proxy of the leading replica (https://host:port), where a
	// replica that holds no tunnel to a worker relays the requests for it (relay.go).
	// Empty: a replica answers only for the tunnels it holds, as a hub of one replica.
	Leader string
	// LeaderTrust is the PEM bundle that verifies the leader's proxy, asked again
	// for each new connection since it rotates.
	LeaderTrust func() []byte
	Log         *slog.Logger
}

// Proxy is the hub's Kubernetes API proxy: Kueue's MultiKueue reaches each worker's
// API server through it, over that worker's tunnel, with a bearer token per worker.
// Serve it on its own HTTPS listener.
type Proxy struct {
	srv       *Server
	opts      ProxyOptions
	transport *http.Transport
	forward   *httputil.ReverseProxy
	relay     *relay
	refusals  logbudget.Budget

	mu       sync.Mutex
	inFlight map[string]int
}

// NewProxy makes the API proxy of the server's tunnels.
func NewProxy(s *Server, opts ProxyOptions) (*Proxy, error) {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 3 << 20
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 64
	}
	if opts.ResumeWindow <= 0 {
		opts.ResumeWindow = time.Minute
	}
	if opts.Log == nil {
		opts.Log = s.opts.Log
	}
	r, err := newRelay(opts)
	if err != nil {
		return nil, err
	}
	p := &Proxy{srv: s, opts: opts, relay: r, inFlight: map[string]int{}}
	p.transport = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			st, _, err := p.dial(strings.TrimSuffix(host, upstreamHost))
			return st, err
		},
		// An idle worker holds no stream for long.
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		// The client's Accept-Encoding passes through; the transport adds none.
		DisableCompression: true,
	}
	p.forward = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = pr.In.Context().Value(targetKey{}).(*url.URL)
			pr.Out.Host = ""
			stripCredentials(pr.Out.Header)
		},
		Transport:     p.transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeStatus(w, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, "the request body is over the proxy's cap")
				return
			}
			if errors.Is(err, context.Canceled) {
				return
			}
			writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "the worker is not reachable through its tunnel")
		},
	}
	return p, nil
}

type targetKey struct{}

// stripCredentials drops what would speak for the caller on the worker: the proxy's
// token, and any attempt to impersonate. The agent drops them too. The mark of a relay
// between the hub's replicas goes too: it is no business of the worker's.
func stripCredentials(h http.Header) {
	h.Del("Authorization")
	h.Del(relayedHeader)
	for k := range h {
		if strings.HasPrefix(k, "Impersonate-") {
			delete(h, k)
		}
	}
}

// ServeHTTP routes /clusters/<identity>/<API path> to the identity's worker.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	identity, rest, ok := splitProxyPath(r.URL.EscapedPath())
	if !ok {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "not a path of the proxy: /clusters/<identity>/...")
		return
	}
	// Built when something is logged: a watch lasts long, and a logger made up front
	// would be held all that time.
	log := func() *slog.Logger {
		return p.opts.Log.With("identity", identity, "method", r.Method, "remote", r.RemoteAddr)
	}
	if reason := p.authorize(r.Context(), identity, r); reason != "" {
		p.refusals.Log(log(), slog.LevelWarn, "proxy request refused", "reason", reason)
		// No detail: a caller learns neither whether the identity exists nor why.
		writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	if !p.acquire(identity) {
		w.Header().Set("Retry-After", "1")
		writeStatus(w, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, fmt.Sprintf("more than %d requests open to this worker", p.opts.MaxInFlight))
		return
	}
	defer p.release(identity)
	if r.ContentLength > p.opts.MaxBodyBytes {
		writeStatus(w, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge, "the request body is over the proxy's cap")
		return
	}
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, p.opts.MaxBodyBytes)
	}
	target := &url.URL{Scheme: "http", Host: identity + upstreamHost, RawQuery: r.URL.RawQuery}
	target.Path, _ = url.PathUnescape(rest)
	target.RawPath = rest
	watching := r.Method == http.MethodGet && isWatch(r.URL.Query())
	sess := p.srv.session(identity)
	switch {
	case sess != nil && sess.version < protocol.ProxyVersion:
		writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable,
			fmt.Sprintf("the worker's agent speaks tunnel protocol %d, dispatch needs %d: upgrade the agent", sess.version, protocol.ProxyVersion))
	case watching && (sess != nil || p.relay != nil):
		// A watch finds its way itself, and outlives the way it took.
		p.watch(w, r, identity, target, log)
	default:
		p.serve(w, r, identity, target, log)
	}
}

// serve forwards a request other than a watch through this replica's tunnel to the
// worker, or else through the leader's proxy. While no replica reaches a worker that
// is expected back (relayHoldsFor), a GET waits for one up to ResumeWindow: Kueue
// builds a new client for a worker whose watch ended, and its discovery must not fail
// during a failover, or Kueue waits out a backoff of seconds before it tries again.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, identity string, target *url.URL, log func() *slog.Logger) {
	var deadline time.Time
	for {
		if p.srv.session(identity) != nil {
			p.forward.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, target)))
			return
		}
		if p.relay != nil && !relayed(r) {
			_, forward, err := p.relay.client()
			if err != nil {
				log().Error("relaying to the leader's proxy", "error", err)
			} else {
				failed := false
				forward.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), relayFailedKey{}, &failed)))
				if !failed {
					return
				}
			}
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(p.opts.ResumeWindow)
		}
		if r.Method != http.MethodGet || !p.relayHoldsFor(r.Context(), identity) || !p.awaitAgent(r.Context(), identity, nil, deadline) {
			writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "the worker's agent is not connected")
			return
		}
	}
}

// splitProxyPath splits /clusters/<identity>/<rest> into the identity and /<rest>.
func splitProxyPath(path string) (identity, rest string, ok bool) {
	tail, ok := strings.CutPrefix(path, ProxyPathPrefix)
	if !ok {
		return "", "", false
	}
	identity, rest, _ = strings.Cut(tail, "/")
	if !validIdentity(identity) {
		return "", "", false
	}
	return identity, "/" + rest, true
}

// authorize checks the bearer token against the identity's; it returns why it refuses,
// for the log, or "".
func (p *Proxy) authorize(ctx context.Context, identity string, r *http.Request) string {
	raw, ok := bearer(r)
	if !ok {
		return "no bearer token"
	}
	tok, err := secrets.ParseToken(raw)
	if err != nil {
		return "the bearer token is not of flotilla's shape"
	}
	want, err := p.srv.proxyTokenHash(ctx, identity, p.relay != nil)
	switch {
	case err != nil:
		return "reading the proxy token's hash: " + err.Error()
	case want.IsZero():
		return "no proxy token is issued for this identity"
	case !tok.Hash().Equal(want):
		return "the bearer token is not this identity's proxy token (fingerprint " + tok.Hash().Fingerprint() + ")"
	}
	return ""
}

func (p *Proxy) acquire(identity string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[identity] >= p.opts.MaxInFlight {
		return false
	}
	p.inFlight[identity]++
	return true
}

func (p *Proxy) release(identity string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[identity]--; p.inFlight[identity] <= 0 {
		delete(p.inFlight, identity)
	}
}

// errNotDispatchable is a dial to an identity whose agent is away or too old.
var errNotDispatchable = errors.New("the worker's agent is not connected, or speaks no API proxy")

// dial opens a proxy stream to the identity's agent, and says on which session.
func (p *Proxy) dial(identity string) (net.Conn, *session, error) {
	sess := p.srv.session(identity)
	if sess == nil || sess.version < protocol.ProxyVersion {
		return nil, nil, errNotDispatchable
	}
	st, err := sess.tunnel.OpenStream()
	if err != nil {
		return nil, sess, fmt.Errorf("opening a proxy stream to %s: %w", identity, err)
	}
	// The kind byte is buffered by yamux; a write that fails means the tunnel is gone.
	if err := protocol.WriteStreamKind(st, protocol.StreamProxy); err != nil {
		_ = st.Close()
		return nil, sess, err
	}
	return st, sess, nil
}

func isWatch(q url.Values) bool {
	v := q.Get("watch")
	b, _ := strconv.ParseBool(v)
	return b
}

// writeStatus answers as the API server would, with a Status object.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg}
	body, _ := json.Marshal(st)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
