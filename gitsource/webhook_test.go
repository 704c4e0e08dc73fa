package gitsource_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/logbudget"
	"github.com/flotilla-gitops/flotilla/test/logtest"
)

const secret = "webhook-secret-of-the-test"

func hmacHex(key, body string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}

type delivery struct {
	method  string
	headers map[string]string
	body    string
}

func github(event, id, sig string) delivery {
	return delivery{headers: map[string]string{"X-GitHub-Event": event, "X-GitHub-Delivery": id, "X-Hub-Signature-256": sig}, body: `{"ref":"refs/heads/main"}`}
}

func gitea(event, id, sig string) delivery {
	// Gitea sends GitHub's headers too, with GitHub's signature header unset or stale.
	return delivery{headers: map[string]string{"X-Gitea-Event": event, "X-Gitea-Delivery": id, "X-Gitea-Signature": sig,
		"X-GitHub-Event": event, "X-GitHub-Delivery": id, "X-Hub-Signature-256": "sha256=" + hmacHex("stale", "")}, body: `{"ref":"refs/heads/main"}`}
}

func gitlab(event, id, token string) delivery {
	return delivery{headers: map[string]string{"X-Gitlab-Event": event, "X-Gitlab-Event-UUID": id, "X-Gitlab-Token": token}, body: `{"ref":"refs/heads/main"}`}
}

func TestWebhooks(t *testing.T) {
	body := `{"ref":"refs/heads/main"}`
	ghSig := "sha256=" + hmacHex(secret, body)
	gtSig := hmacHex(secret, body)
	for _, tc := range []struct {
		name     string
		d        delivery
		code     int
		triggers int
		logged   string
	}{
		{"GitHub push, right signature", github("push", "gh-1", ghSig), 202, 1, "webhook accepted"},
		{"GitHub pull request", github("pull_request", "gh-2", ghSig), 202, 1, "webhook accepted"},
		{"GitHub ping", github("ping", "gh-3", ghSig), 202, 0, ""},
		{"GitHub wrong signature", github("push", "gh-4", "sha256="+hmacHex("other", body)), 401, 0, "wrong signature"},
		{"GitHub missing signature", github("push", "gh-5", ""), 401, 0, "unsigned"},
		{"GitHub malformed signature", github("push", "gh-6", "sha1=abc"), 401, 0, "malformed signature"},
		{"Gitea push, right signature", gitea("push", "gt-1", gtSig), 202, 1, "forge=gitea"},
		{"Gitea wrong signature", gitea("push", "gt-2", hmacHex("other", body)), 401, 0, "wrong signature"},
		{"Gitea missing signature", gitea("push", "gt-3", ""), 401, 0, "unsigned"},
		{"GitLab push, right token", gitlab("Push Hook", "gl-1", secret), 202, 1, "forge=gitlab"},
		{"GitLab merge request", gitlab("Merge Request Hook", "gl-2", secret), 202, 1, "webhook accepted"},
		{"GitLab wrong token", gitlab("Push Hook", "gl-3", "guess"), 401, 0, "wrong token"},
		{"GitLab missing token", gitlab("Push Hook", "gl-4", ""), 401, 0, "no token"},
		{"no forge headers", delivery{headers: map[string]string{}, body: body}, 401, 0, "no forge event header"},
		{"GET", delivery{method: http.MethodGet, headers: map[string]string{}}, 405, 0, ""},
		{"a signed body over the cap", delivery{headers: map[string]string{"X-GitHub-Event": "push", "X-Hub-Signature-256": "sha256=" + hmacHex(secret, strings.Repeat("x", 2048))}, body: strings.Repeat("x", 2048)}, 413, 0, "body too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			var mu sync.Mutex
			triggers := 0
			h := gitsource.NewWebhookHandler(gitsource.WebhookOptions{
				Secret:  []byte(secret),
				MaxBody: 1024,
				Trigger: func(gitsource.Forge, string) { mu.Lock(); triggers++; mu.Unlock() },
				Log:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			})
			method := tc.d.method
			if method == "" {
				method = http.MethodPost
			}
			req := httptest.NewRequest(method, "/v1/webhook", strings.NewReader(tc.d.body))
			for k, v := range tc.d.headers {
				if v != "" {
					req.Header.Set(k, v)
				}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code || triggers != tc.triggers {
				t.Fatalf("status %d with %d triggers, want %d with %d", rec.Code, triggers, tc.code, tc.triggers)
			}
			if tc.code == 401 && strings.TrimSpace(rec.Body.String()) != "unauthorized" {
				t.Errorf("a refused delivery was told %q", rec.Body.String())
			}
			if !strings.Contains(logs.String(), tc.logged) {
				t.Errorf("log %q lacks %q", logs.String(), tc.logged)
			}
			if strings.Contains(logs.String(), secret) {
				t.Error("the secret was logged")
			}
			// The same delivery again is acknowledged and does nothing.
			if tc.code == 202 && tc.triggers == 1 {
				req := httptest.NewRequest(method, "/v1/webhook", strings.NewReader(tc.d.body))
				for k, v := range tc.d.headers {
					req.Header.Set(k, v)
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != 200 || triggers != 1 {
					t.Fatalf("a replayed delivery: status %d, %d triggers", rec.Code, triggers)
				}
			}
		})
	}
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r    io.Reader
	read int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}

// A delivery its headers already refuse is refused before a byte of its body is read:
// a caller without the secret costs the hub its headers, however much it sends.
func TestADeliveryItsHeadersRefuseIsRefusedUnread(t *testing.T) {
	const size = 1 << 20
	h := gitsource.NewWebhookHandler(gitsource.WebhookOptions{Secret: []byte(secret), Log: slog.New(slog.DiscardHandler)})
	for _, tc := range []struct {
		name string
		d    delivery
	}{
		{"GitLab, a wrong token", gitlab("Push Hook", "gl-1", "guess")},
		{"GitLab, no token", gitlab("Push Hook", "gl-2", "")},
		{"GitHub, unsigned", github("push", "gh-1", "")},
		{"GitHub, a signature that is none", github("push", "gh-2", "sha256=abcd")},
		{"no forge", delivery{headers: map[string]string{"X-Other-Event": "push"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &countingReader{r: bytes.NewReader(bytes.Repeat([]byte("x"), size))}
			req := httptest.NewRequest(http.MethodPost, "/v1/webhook", body)
			for k, v := range tc.d.headers {
				if v != "" {
					req.Header.Set(k, v)
				}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusUnauthorized || body.read != 0 {
				t.Fatalf("status %d after reading %d bytes of the body; want 401 with none read", rec.Code, body.read)
			}
		})
	}
}

func TestNoSecretRefusesEverything(t *testing.T) {
	h := gitsource.NewWebhookHandler(gitsource.WebhookOptions{Trigger: func(gitsource.Forge, string) { t.Error("triggered") }})
	for _, d := range []delivery{github("push", "1", "sha256="+hmacHex("", "{}")), gitlab("Push Hook", "2", "")} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("{}"))
		for k, v := range d.headers {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 401 {
			t.Errorf("status %d, want 401", rec.Code)
		}
	}
}

// A flood of refused deliveries, to one source's webhook or spread over several, is not
// a flood of log lines: the handlers share the budget the hub gives them.
func TestAFloodOfRefusedDeliveriesIsLoggedWithinTheBudget(t *testing.T) {
	var logs logtest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	budget := &logbudget.Budget{PerSecond: 5}
	handlers := []*gitsource.WebhookHandler{
		gitsource.NewWebhookHandler(gitsource.WebhookOptions{Secret: []byte(secret), Refusals: budget, Log: log}),
		gitsource.NewWebhookHandler(gitsource.WebhookOptions{Secret: []byte(secret), Refusals: budget, Log: log}),
	}
	const flood = 2000
	start := time.Now()
	for i := range flood {
		d := github("push", strconv.Itoa(i), "sha256="+hmacHex("guess", `{"ref":"refs/heads/main"}`))
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(d.body))
		for k, v := range d.headers {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		handlers[i%len(handlers)].ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Fatalf("delivery %d: status %d, want 401", i, rec.Code)
		}
	}
	// Every second the flood touched may log its five.
	seconds := int(time.Since(start)/time.Second) + 2
	lines := strings.Count(logs.String(), "webhook refused")
	if lines == 0 || lines > budget.PerSecond*seconds {
		t.Fatalf("%d of %d refused deliveries logged over at most %d seconds; want between 1 and %d", lines, flood, seconds, budget.PerSecond*seconds)
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatal("the log holds the webhook secret")
	}
}
