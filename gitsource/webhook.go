package gitsource

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"k8s.io/utils/lru"

	"github.com/flotilla-gitops/flotilla/reconciler/logbudget"
)

// DefaultMaxWebhookBody bounds a delivery's body. GitHub caps payloads at 25 MB; the hub
// reads none of it beyond the signature, so a smaller cap refuses only abuse.
const DefaultMaxWebhookBody = 5 << 20

// Forge names the sender of a webhook.
type Forge string

const (
	GitHub Forge = "github"
	Gitea  Forge = "gitea"
	GitLab Forge = "gitlab"
)

// WebhookOptions configure a WebhookHandler.
type WebhookOptions struct {
	// Secret is the webhook's shared secret: the HMAC key on GitHub and Gitea, the token
	// on GitLab. An empty secret refuses every delivery.
	Secret []byte
	// MaxBody defaults to DefaultMaxWebhookBody.
	MaxBody int64
	// Trigger is called for each accepted push or pull-request event.
	Trigger func(Forge, string)
	// Refusals bounds the log lines of refused deliveries: anyone who reaches the
	// webhook can send garbage as fast as the network carries it. The hub shares one
	// among its sources' handlers; nil gives the handler one of its own.
	Refusals *logbudget.Budget
	Log      *slog.Logger
}

// WebhookHandler accepts deliveries from GitHub, Gitea and GitLab. A delivery only
// triggers a fetch: what changed is read from the repository, not from the payload.
type WebhookHandler struct {
	opts WebhookOptions
	mu   sync.Mutex
	seen *lru.Cache
}

// NewWebhookHandler makes a handler; deliveries it has seen are remembered by ID so that
// a redelivery does not fetch twice.
func NewWebhookHandler(opts WebhookOptions) *WebhookHandler {
	if opts.MaxBody <= 0 {
		opts.MaxBody = DefaultMaxWebhookBody
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Refusals == nil {
		opts.Refusals = new(logbudget.Budget)
	}
	return &WebhookHandler{opts: opts, seen: lru.New(4096)}
}

func (h *WebhookHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	// A delivery is refused on its headers before a byte of its body is read, and one
	// that carries a signature is checked as its body is read, never held: a caller
	// without the secret costs the hub no memory for what it sends, and, unless it
	// makes up a signature, no reading either.
	forge, event, delivery, reason, err := h.verify(r, http.MaxBytesReader(w, r.Body, h.opts.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.opts.Refusals.Log(h.opts.Log, slog.LevelInfo, "webhook refused", "forge", forge, "event", event, "delivery", delivery, "reason", "body too large", "limit", h.opts.MaxBody, "remote", r.RemoteAddr)
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	if reason != "" {
		// The caller learns nothing about why; the operator does.
		h.opts.Refusals.Log(h.opts.Log, slog.LevelInfo, "webhook refused", "forge", forge, "event", event, "delivery", delivery, "reason", reason, "remote", r.RemoteAddr)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if delivery != "" && h.replayed(string(forge)+"/"+delivery) {
		h.opts.Log.Info("webhook ignored", "forge", forge, "event", event, "delivery", delivery, "reason", "delivery seen before")
		w.WriteHeader(http.StatusOK)
		return
	}
	if !triggers(forge, event) {
		h.opts.Log.Debug("webhook ignored", "forge", forge, "event", event, "delivery", delivery)
		w.WriteHeader(http.StatusAccepted)
		return
	}
	h.opts.Log.Info("webhook accepted", "forge", forge, "event", event, "delivery", delivery)
	if h.opts.Trigger != nil {
		h.opts.Trigger(forge, event)
	}
	w.WriteHeader(http.StatusAccepted)
}

// verify tells the forge, the event and the delivery ID, and why the request is
// refused, if it is; err is set when body, read only for a signature, could not be.
// Gitea also sends GitHub's headers, so it is recognized first. GitLab's token is a
// header: its body is not read at all.
func (h *WebhookHandler) verify(r *http.Request, body io.Reader) (forge Forge, event, delivery, reason string, err error) {
	hd := r.Header
	switch {
	case hd.Get("X-Gitea-Event") != "":
		forge, event, delivery = Gitea, hd.Get("X-Gitea-Event"), hd.Get("X-Gitea-Delivery")
		reason, err = h.checkHMAC(hd.Get("X-Gitea-Signature"), "", body)
	case hd.Get("X-GitHub-Event") != "":
		forge, event, delivery = GitHub, hd.Get("X-GitHub-Event"), hd.Get("X-GitHub-Delivery")
		reason, err = h.checkHMAC(hd.Get("X-Hub-Signature-256"), "sha256=", body)
	case hd.Get("X-Gitlab-Event") != "":
		forge, event, delivery = GitLab, hd.Get("X-Gitlab-Event"), hd.Get("X-Gitlab-Event-UUID")
		reason = h.checkToken(hd.Get("X-Gitlab-Token"))
	default:
		reason = "no forge event header"
	}
	return forge, event, delivery, reason, err
}

// checkHMAC checks the signature sig of body, read only once the signature is known to
// be one.
func (h *WebhookHandler) checkHMAC(sig, prefix string, body io.Reader) (string, error) {
	if len(h.opts.Secret) == 0 {
		return "no webhook secret is configured", nil
	}
	if sig == "" {
		return "unsigned", nil
	}
	hexSig, ok := strings.CutPrefix(sig, prefix)
	got, err := hex.DecodeString(hexSig)
	if !ok || err != nil || len(got) != sha256.Size {
		return "malformed signature", nil
	}
	mac := hmac.New(sha256.New, h.opts.Secret)
	if _, err := io.Copy(mac, body); err != nil {
		return "", err
	}
	if !hmac.Equal(got, mac.Sum(nil)) {
		return "wrong signature", nil
	}
	return "", nil
}

func (h *WebhookHandler) checkToken(token string) string {
	if len(h.opts.Secret) == 0 {
		return "no webhook secret is configured"
	}
	if token == "" {
		return "no token"
	}
	if subtle.ConstantTimeCompare([]byte(token), h.opts.Secret) != 1 {
		return "wrong token"
	}
	return ""
}

func (h *WebhookHandler) replayed(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.seen.Get(id); ok {
		return true
	}
	h.seen.Add(id, struct{}{})
	return false
}

// triggers says which events can change what the hub reads.
func triggers(forge Forge, event string) bool {
	switch forge {
	case GitHub, Gitea:
		return event == "push" || event == "pull_request"
	case GitLab:
		return event == "Push Hook" || event == "Merge Request Hook"
	}
	return false
}
