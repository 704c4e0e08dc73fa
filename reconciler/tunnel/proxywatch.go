package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// watch relays a watch to the worker. Kueue v0.17.0 may evict work when a watch to a
// worker ends (kueue#12999), so a tunnel that breaks under a watch does not end it:
// the proxy waits up to ResumeWindow for the agent to redial and asks the worker to
// go on from the last resourceVersion it passed on. So does a watch the worker's API
// server ends on its own timeout, when the watcher asked for none: the API server
// closes every watch within an hour of its start. The watch ends when the caller
// leaves, when the worker ends it otherwise (an ERROR event such as 410 Gone, which is
// passed on), or when the agent stays away past the window. A replica that relays
// (relay.go) goes through the leader, and holds a new watch open while no replica
// reaches the worker if relayHoldsFor says the worker is expected back.
//
// A watch is relayed on a stream of its own, read by this goroutine alone: an idle
// worker's watches cost the hub a stream and a small buffer each.
func (p *Proxy) watch(w http.ResponseWriter, r *http.Request, identity string, target *url.URL, log func() *slog.Logger) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	started := false
	var rv string
	var deadline time.Time // set when the way to the worker broke
	// The watcher's own timeout ends its watch; without one, the worker's does not.
	ownTimeout := target.Query().Get("timeoutSeconds") != ""
	quiet := 0 // clean ends in a row with no event between them
	for {
		u := *target
		if rv != "" {
			// Events up to rv were passed on; the first question no longer applies.
			query := target.Query()
			query.Set("resourceVersion", rv)
			query.Del("resourceVersionMatch")
			query.Del("sendInitialEvents")
			u.RawQuery = query.Encode()
		}
		resp, sess, err := p.openUpstream(ctx, r, identity, &u)
		if err != nil {
			if !started {
				if !acceptsJSON(r.Header.Values("Accept")) || !p.relayHoldsFor(ctx, identity) {
					writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "the worker is not reachable through its tunnel")
					return
				}
				// Answered at once: Kueue counts the worker as reached when its watch
				// starts, and evicts while it does not (see relay.go).
				started = true
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusOK)
				_ = rc.Flush()
				log().Info("no replica reaches the worker now: holding its watch open", "window", p.opts.ResumeWindow)
			}
			if deadline.IsZero() {
				deadline = time.Now().Add(p.opts.ResumeWindow)
			}
			if !p.awaitAgent(ctx, identity, sess, deadline) {
				p.logEnd(ctx, log)
				return
			}
			continue
		}
		deadline = time.Time{}
		if !started {
			started = true
			copyResponseHeader(w.Header(), resp.Header)
			resp.Header = nil // copied: not held for as long as the watch lasts
			w.WriteHeader(resp.StatusCode)
			_ = rc.Flush()
			if resp.StatusCode != http.StatusOK || !isJSON(w.Header().Get("Content-Type")) {
				// Nothing to resume from: pass it through as it comes.
				_, _ = io.Copy(flushWriter{w, rc}, resp.Body)
				_ = resp.Body.Close()
				return
			}
		} else if resp.StatusCode != http.StatusOK {
			_ = resp.Body.Close()
			log().Info("watch ended: the worker did not take it up again", "status", resp.StatusCode)
			return
		}
		from := rv
		end := relayEvents(flushWriter{w, rc}, resp.Body, &rv)
		_ = resp.Body.Close()
		switch {
		case ctx.Err() != nil || end == endedForGood:
			return
		case end == endedByWorker:
			// A worker's API server ends a watch cleanly on its timeout; through a
			// relay, the leader ended it for good. A worker that keeps ending it with
			// no event in between is not asked again and again.
			if rv == from {
				quiet++
			} else {
				quiet = 0
			}
			if ownTimeout || sess == nil || rv == "" || quiet >= maxQuietEnds {
				return
			}
			continue
		}
		log().Info("the way to the worker broke under a watch: waiting for it to come back", "resourceVersion", rv, "window", p.opts.ResumeWindow)
		deadline = time.Now().Add(p.opts.ResumeWindow)
		if !p.awaitAgent(ctx, identity, sess, deadline) {
			p.logEnd(ctx, log)
			return
		}
	}
}

// maxQuietEnds is how many times in a row a worker may end a watch cleanly, with no
// event in between, before the proxy passes the end on: an idle watch (Kueue asks for
// bookmarks, so none of its watches is idle for long) ends after that many of the API
// server's timeouts, not at the first.
const maxQuietEnds = 3

// openUpstream opens the watch through this replica's tunnel to the worker, or else
// through the leader's proxy; the session is nil for the latter.
func (p *Proxy) openUpstream(ctx context.Context, in *http.Request, identity string, u *url.URL) (*http.Response, *session, error) {
	if p.relay == nil || relayed(in) || p.srv.session(identity) != nil {
		return p.openWatch(ctx, in, identity, u)
	}
	resp, err := p.relay.openWatch(ctx, in, identity, u)
	return resp, nil, err
}

// logEnd says why a watch that waited for its agent ended.
func (p *Proxy) logEnd(ctx context.Context, log func() *slog.Logger) {
	if ctx.Err() != nil {
		log().Info("watch ended by the watcher while its agent was away")
		return
	}
	log().Info("watch ended: the agent did not come back within the resume window", "window", p.opts.ResumeWindow)
}

// openWatch sends the watch request on a stream of its own and reads the answer's
// header. The answer's body owns the stream; the caller leaving closes it.
func (p *Proxy) openWatch(ctx context.Context, in *http.Request, identity string, u *url.URL) (*http.Response, *session, error) {
	conn, sess, err := p.dial(identity)
	if err != nil {
		return nil, sess, err
	}
	out, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		_ = conn.Close()
		return nil, sess, err
	}
	out.Header = in.Header.Clone()
	stripCredentials(out.Header)
	out.Header.Del("Connection")
	// The proxy reads the events to resume from them: they come uncompressed. Each is
	// flushed on its own, so compression would gain little anyway.
	out.Header.Del("Accept-Encoding")
	// And as JSON, when the caller takes JSON: controller-runtime asks for protobuf
	// for built-in kinds (Kueue's watch of batch Jobs), offering */* besides, and a
	// protobuf stream could not be resumed, so a tunnel blip would end that watch.
	// client-go decodes a watch by the answer's Content-Type.
	if acceptsJSON(out.Header.Values("Accept")) {
		out.Header.Set("Accept", "application/json")
	}
	out.Close = true
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	if err := out.Write(conn); err != nil {
		stop()
		_ = conn.Close()
		return nil, sess, err
	}
	// A small buffer: an idle watch holds it for as long as it lasts. It holds chunk
	// sizes and headers; an event larger than it is read past it, into the caller's
	// buffer.
	head := &readBudget{r: conn, left: maxResponseHead}
	resp, err := http.ReadResponse(bufio.NewReaderSize(head, 256), out)
	if err != nil {
		stop()
		_ = conn.Close()
		return nil, sess, err
	}
	head.left = -1 // the body's events have a budget each
	// Nor does a watch hold its request once it is sent.
	resp.Request = nil
	resp.Body = closer{resp.Body, func() { stop(); _ = conn.Close() }}
	return resp, sess, nil
}

// awaitAgent waits until the identity has a session other than gone that serves the
// proxy, or, on a replica that relays, until it is time to ask the leader again; it
// reports whether to try again before the deadline.
func (p *Proxy) awaitAgent(ctx context.Context, identity string, gone *session, deadline time.Time) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		sess, wake := p.srv.sessionAndWake(identity)
		if !p.inFleet(ctx, identity) {
			return false // the cluster left the fleet
		}
		var retry <-chan time.Time
		switch {
		case sess != nil && sess != gone:
			return true
		case sess != nil && !sess.tunnel.IsClosed():
			// The same tunnel is up: only the stream failed. Try again shortly.
			retry = time.After(time.Second)
		case p.relay != nil:
			// A standby learns of a new leader only by asking.
			retry = time.After(relayRetry)
		}
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return false
		case <-wake:
		case <-retry:
			return true
		}
	}
}

// inFleet reports whether the identity's cluster is in the fleet: one this replica
// pushed to, or, on a replica that relays, one the hub cluster holds.
func (p *Proxy) inFleet(ctx context.Context, identity string) bool {
	if _, known := p.srv.known(identity); known || p.relay == nil {
		return known
	}
	_, err := p.srv.lookup(ctx, identity, "")
	return err == nil
}

// watchEnd is how a relayed watch stream ended.
type watchEnd int

const (
	// endedBroken: the way to the worker broke under it; it may be resumed.
	endedBroken watchEnd = iota
	// endedByWorker: the other end closed it cleanly.
	endedByWorker
	// endedForGood: the caller left, the worker sent an ERROR event, or what came
	// does not parse or is too large.
	endedForGood
)

// relayEvents passes on a JSON watch stream event by event, noting the resourceVersion
// of each, and says how it ended.
func relayEvents(w flushWriter, body io.Reader, rv *string) watchEnd {
	// A decoder holds an event whole before it returns it, and the worker says how large
	// it is: the budget ends a watch whose event outgrows any object's.
	re := &readErr{r: body}
	r := &readBudget{r: re}
	var dec *json.Decoder
	for {
		r.left = maxWatchEvent
		// A decoder keeps a buffer as large as the largest event it read: a watch that
		// was busy once would hold it for as long as it stays open. A new decoder
		// after each event that left nothing but its newline buffered holds only what
		// one read takes.
		if dec == nil || onlySpace(dec.Buffered()) {
			dec = json.NewDecoder(r)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			// A watch the worker ends cleanly closes its chunked body: io.EOF. A
			// tunnel that breaks cuts it short: a read error. What does not parse, or
			// is too large, cannot be resumed.
			switch {
			case re.err == nil:
				return endedForGood
			case errors.Is(re.err, io.EOF):
				return endedByWorker
			}
			return endedBroken
		}
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			} `json:"object"`
		}
		_ = json.Unmarshal(raw, &ev)
		if _, err := w.Write(append(raw, '\n')); err != nil {
			return endedForGood // the caller left
		}
		if ev.Type == "ERROR" {
			return endedForGood
		}
		if v := ev.Object.Metadata.ResourceVersion; v != "" {
			*rv = v
		}
	}
}

// maxWatchEvent bounds one event of a watch the proxy relays. etcd keeps objects of up
// to 1.5 MiB; one as JSON, escaped and wrapped in its event, stays well under this.
const maxWatchEvent = 8 << 20

// maxResponseHead bounds the status line and headers of the worker's answer to a
// watch, as net/http's server bounds a request's (http.DefaultMaxHeaderBytes).
const maxResponseHead = http.DefaultMaxHeaderBytes

// errTooLarge ends a read past its budget.
var errTooLarge = errors.New("larger than the proxy relays")

// readBudget reads at most left bytes of r, and fails past them; a negative left
// reads on without a bound.
type readBudget struct {
	r    io.Reader
	left int64
}

func (b *readBudget) Read(p []byte) (int, error) {
	if b.left < 0 {
		return b.r.Read(p)
	}
	if b.left == 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// onlySpace reports whether what r holds is JSON whitespace, which a new decoder may
// drop.
func onlySpace(r io.Reader) bool {
	b, _ := io.ReadAll(r)
	return len(bytes.TrimLeft(b, " \t\r\n")) == 0
}

// acceptsJSON reports whether a request with these Accept headers takes a plain JSON
// answer: no Accept at all, or a media range that covers application/json without
// asking for another form of it (such as a Table).
func acceptsJSON(accept []string) bool {
	if len(accept) == 0 {
		return true
	}
	for _, h := range accept {
		for r := range strings.SplitSeq(h, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(r))
			if err != nil {
				continue
			}
			delete(params, "q")
			if len(params) == 0 && (mt == "application/json" || mt == "application/*" || mt == "*/*") {
				return true
			}
		}
	}
	return false
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// copyResponseHeader copies the answer's headers without those that belong to one
// connection.
func copyResponseHeader(dst, src http.Header) {
	for k, vs := range src {
		switch k {
		case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade", "Content-Length":
			continue
		}
		dst[k] = vs
	}
}

// flushWriter flushes each write: a watch event must reach the watcher at once.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if err != nil {
		return n, err
	}
	return n, f.rc.Flush()
}

// readErr remembers the error of the reads under a decoder, to tell a stream that
// broke from one that did not parse.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if err != nil {
		r.err = err
	}
	return n, err
}

type closer struct {
	io.Reader
	close func()
}

func (c closer) Close() error { c.close(); return nil }
