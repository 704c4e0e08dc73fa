package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
)

// DefaultServiceAccount is the ServiceAccount, in the agent's namespace, whose identity
// the proxy forwards requests under. The agent chart creates it, binds it to exactly the
// allowlist's rules and lets the agent impersonate it.
const DefaultServiceAccount = "flotilla-dispatch"

// Defaults of the caps.
const (
	// DefaultMaxBodyBytes caps a request body: the API server's own limit on an object
	// is 3 MiB (etcd's request size), so nothing larger can be stored anyway.
	DefaultMaxBodyBytes = 3 << 20
	// DefaultMaxConcurrent caps the requests in flight: MultiKueue holds one watch per
	// kind and makes a few calls per reconcile, far below it.
	DefaultMaxConcurrent = 64
	// DefaultMaxInspecting caps the bodies and answers held in memory to be checked at
	// once (guard.go): with DefaultMaxBodyBytes, 12 MiB at worst. More wait their turn.
	DefaultMaxInspecting = 4
	// DefaultScopeWait is how long a request that arrives before the agent's first scope
	// waits for it: the hub sends its desired state as soon as the agent connects, and
	// the requests of its Kueue (a watch it resumes across an agent's restart) arrive on
	// the same tunnel at the same time. Refused at once, they would tell Kueue the
	// worker is gone.
	DefaultScopeWait = 30 * time.Second
)

// retryAfterSeconds is what a request over the concurrency cap is told to wait; client-go
// honours it and retries.
const retryAfterSeconds = 1

// Options configure a Handler.
type Options struct {
	// Config reaches the worker's API server as the agent. It is copied; the copy
	// impersonates the ServiceAccount.
	Config *rest.Config
	// Namespace is the agent's namespace, where the ServiceAccount is.
	Namespace string
	// ServiceAccount is the identity requests are forwarded under. Default
	// DefaultServiceAccount.
	ServiceAccount string
	// Integrations are the job kinds the hub's MultiKueue dispatches. Nil means
	// DefaultIntegrations; an empty, non-nil slice forwards Workloads only.
	Integrations []Integration
	// MaxBodyBytes caps a request body; a larger one is answered 413. Default
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxConcurrent caps the requests in flight, watches included; one more is answered
	// 429 with Retry-After. Default DefaultMaxConcurrent.
	MaxConcurrent int
	// MaxInspecting caps the bodies and answers held in memory while they are checked.
	// Default DefaultMaxInspecting.
	MaxInspecting int
	// ScopeWait is how long a request waits for the first scope before it is refused.
	// Default DefaultScopeWait.
	ScopeWait time.Duration
	// Namespaces, when not empty, are the only workload namespaces the worker's
	// administrator lets the hub reach (the agent chart's dispatch.namespaces): the
	// scope the hub sends is narrowed to them.
	Namespaces []string
	// ClusterRole is the ClusterRole of the dispatch identity's namespaced rules
	// (NamespacedPolicyRules), which the handler binds in each namespace of its scope
	// with a RoleBinding of the same name, as the agent, and in no other (SetScope).
	// Empty writes no RoleBinding: the API server must then grant those rules
	// otherwise, and does not narrow them by namespace.
	ClusterRole string
	Log         *slog.Logger
}

// Handler forwards the hub's Kubernetes API requests to the worker's API server under
// the ServiceAccount's identity, if the allowlist has them. See the package doc.
type Handler struct {
	rules      []Rule
	user       string
	namespace  string
	maxBody    int64
	slots      chan struct{}
	inspecting chan struct{}
	proxy      *httputil.ReverseProxy
	// direct reaches the worker's API server as the dispatch identity, for the live
	// objects the guard reads.
	direct *http.Client
	target *url.URL
	log    *slog.Logger

	allowNamespaces []string
	binder          *binder
	scopeMu         sync.Mutex // one SetScope at a time
	scope           atomic.Pointer[scope]
	// scoped is closed by the first SetScope; until then requests wait up to scopeWait.
	scoped     chan struct{}
	scopedOnce sync.Once
	scopeWait  time.Duration

	logEvery rate.Sometimes
	refused  atomic.Int64
}

// New checks the options and builds the transport to the worker's API server.
func New(opts Options) (*Handler, error) {
	if opts.Config == nil {
		return nil, errors.New("proxy: the worker's rest.Config is required")
	}
	if msgs := validation.IsDNS1123Label(opts.Namespace); len(msgs) > 0 {
		return nil, fmt.Errorf("proxy: namespace %q: %s", opts.Namespace, strings.Join(msgs, "; "))
	}
	if opts.ServiceAccount == "" {
		opts.ServiceAccount = DefaultServiceAccount
	}
	if msgs := validation.IsDNS1123Subdomain(opts.ServiceAccount); len(msgs) > 0 {
		return nil, fmt.Errorf("proxy: ServiceAccount %q: %s", opts.ServiceAccount, strings.Join(msgs, "; "))
	}
	if opts.Integrations == nil {
		opts.Integrations = DefaultIntegrations()
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = DefaultMaxConcurrent
	}
	if opts.MaxInspecting <= 0 {
		opts.MaxInspecting = DefaultMaxInspecting
	}
	if opts.ScopeWait <= 0 {
		opts.ScopeWait = DefaultScopeWait
	}
	for _, ns := range opts.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			return nil, fmt.Errorf("proxy: allowed namespace %q: %s", ns, strings.Join(msgs, "; "))
		}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}

	cfg := rest.CopyConfig(opts.Config)
	user := "system:serviceaccount:" + opts.Namespace + ":" + opts.ServiceAccount
	// No groups: the API server gives an impersonated ServiceAccount its own groups.
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	target, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("proxy: the worker's API server address %q: %w", cfg.Host, err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("proxy: the transport to the worker's API server %s: %w", target.Host, err)
	}

	h := &Handler{
		rules:           Allowlist(opts.Integrations),
		user:            user,
		namespace:       opts.Namespace,
		maxBody:         opts.MaxBodyBytes,
		slots:           make(chan struct{}, opts.MaxConcurrent),
		inspecting:      make(chan struct{}, opts.MaxInspecting),
		direct:          &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		target:          target,
		allowNamespaces: slices.Clone(opts.Namespaces),
		scoped:          make(chan struct{}),
		scopeWait:       opts.ScopeWait,
		log:             opts.Log,
		// The first few refusals, then one per interval: a hub gone wrong cannot flood
		// the worker's log through the agent.
		logEvery: rate.Sometimes{First: 10, Interval: 10 * time.Second},
	}
	h.scope.Store(&scope{})
	if opts.ClusterRole != "" {
		if msgs := validation.IsDNS1123Subdomain(opts.ClusterRole); len(msgs) > 0 {
			return nil, fmt.Errorf("proxy: ClusterRole %q: %s", opts.ClusterRole, strings.Join(msgs, "; "))
		}
		// As the agent itself: the dispatch identity may not bind anything.
		if h.binder, err = newBinder(opts.Config, opts.ClusterRole, opts.Namespace, opts.ServiceAccount); err != nil {
			return nil, err
		}
	}
	h.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			dropCredentials(pr.Out.Header)
			// What the hub asked compressed passes through compressed. What it did not
			// (its watches) must not be compressed by the API server only for Go's
			// transport to inflate it here: a decompressor per watch is 40 KiB of the
			// agent's memory.
			if pr.Out.Header.Get("Accept-Encoding") == "" {
				pr.Out.Header.Set("Accept-Encoding", "identity")
			}
		},
		Transport: rt,
		// Every write goes out at once: a watch's events must not wait in a buffer.
		FlushInterval:  -1,
		ModifyResponse: h.checkAnswer,
		ErrorHandler:   h.upstreamError,
		ErrorLog:       slog.NewLogLogger(opts.Log.Handler(), slog.LevelWarn),
	}
	return h, nil
}

// Rules is the handler's allowlist.
func (h *Handler) Rules() []Rule { return h.rules }

// User is the user name requests are forwarded as.
func (h *Handler) User() string { return h.user }

// dropCredentials removes every header through which the caller could name an identity:
// the transport then adds the agent's own credential and the impersonation of the
// ServiceAccount. client-go keeps an Authorization header it finds, skips impersonation
// when it finds Impersonate-User, and adds to Impersonate-Group and Impersonate-Extra-*
// rather than replacing them: each would let the caller act as someone else. X-Remote-*
// are the API server's front-proxy headers, trusted only from a front proxy's client
// certificate, which the agent does not hold; dropped all the same.
func dropCredentials(h http.Header) {
	for name := range h {
		switch lower := strings.ToLower(name); {
		case lower == "authorization", lower == "proxy-authorization", lower == "cookie",
			strings.HasPrefix(lower, "impersonate-"), strings.HasPrefix(lower, "x-remote-"):
			delete(h, name)
		}
	}
}

// ServeHTTP forwards r if the allowlist and the scope have it, else answers 403.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sc := h.scope.Load()
	req, ref := h.check(r, sc)
	if ref != nil && !req.discovery && h.awaitScope(r.Context()) {
		sc = h.scope.Load()
		req, ref = h.check(r, sc)
	}
	if ref != nil {
		h.refuseLog(r, string(*ref))
		writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, "flotilla-agent: "+string(*ref))
		return
	}
	if r.ContentLength > h.maxBody {
		writeStatus(w, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge,
			fmt.Sprintf("flotilla-agent: the request body is larger than %d bytes", h.maxBody))
		return
	}
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds))
		writeStatus(w, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
			fmt.Sprintf("flotilla-agent: %d requests are in flight already", cap(h.slots)))
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, h.maxBody)
	}
	if !req.discovery {
		if herr := h.guard(r, req, sc); herr != nil {
			if herr.code == http.StatusForbidden {
				h.refuseLog(r, herr.msg)
			}
			herr.write(w)
			return
		}
		if req.verb == "get" {
			// The answer is checked before it goes back (checkAnswer), in JSON, which
			// every client reads: controller-runtime asks for Kubernetes' own kinds in
			// protobuf.
			r.Header.Set("Accept", mediaJSON)
			r = r.WithContext(context.WithValue(r.Context(), answerCheckKey{}, &answerCheck{origin: sc.origin, req: req}))
		}
	}
	h.proxy.ServeHTTP(w, r)
}

// awaitScope waits, up to the handler's ScopeWait, for the first scope, and says
// whether it came meanwhile: false when it was there already, or never came.
func (h *Handler) awaitScope(ctx context.Context) bool {
	select {
	case <-h.scoped:
		return false
	default:
	}
	t := time.NewTimer(h.scopeWait)
	defer t.Stop()
	select {
	case <-h.scoped:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// check reads r as the API server's authorizer would and checks it against the
// allowlist and sc, the scope in force; what the objects carry is checked later.
func (h *Handler) check(r *http.Request, sc *scope) (request, *refusal) {
	req, ref := classify(r)
	if ref != nil || req.discovery {
		return req, ref
	}
	if !allowed(h.rules, req) {
		return req, refusef("%s is not in the allowlist", req)
	}
	selectors, given := r.URL.Query()["labelSelector"]
	if len(selectors) > 1 {
		return req, refusef("the labelSelector parameter is given more than once")
	}
	return req, sc.admits(req, strings.Join(selectors, ""), given)
}

// refuseLog logs a refusal: the first few, then one per interval with a running count.
func (h *Handler) refuseLog(r *http.Request, reason string) {
	n := h.refused.Add(1)
	h.logEvery.Do(func() {
		h.log.Warn("refused a proxied request", "method", r.Method, "path", r.URL.Path, "reason", reason, "refused", n)
	})
}

// upstreamError answers a request the API server did not answer. The detail goes to
// the log only: it names the worker's API server, which the hub has no business knowing.
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		writeStatus(w, http.StatusRequestEntityTooLarge, metav1.StatusReasonRequestEntityTooLarge,
			fmt.Sprintf("flotilla-agent: the request body is larger than %d bytes", mbe.Limit))
		return
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the hub went away; nobody reads an answer
	}
	h.log.Warn("the worker's API server did not answer a proxied request", "method", r.Method, "path", r.URL.Path, "error", err)
	writeStatus(w, http.StatusBadGateway, metav1.StatusReasonServiceUnavailable, "flotilla-agent: the worker's API server did not answer")
}

// writeStatus answers with a Kubernetes Status, which client-go turns into a typed error.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	body := statusBody(code, reason, msg)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

func statusBody(code int, reason metav1.StatusReason, msg string) []byte {
	body, _ := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   reason,
		Code:     int32(code),
	})
	return body
}
