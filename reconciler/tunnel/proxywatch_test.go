package tunnel

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

// Kueue's client asks for protobuf for built-in kinds and offers JSON besides: the proxy
// asks the worker for JSON then, since only a JSON watch can be resumed.
func TestAcceptsJSON(t *testing.T) {
	for _, tc := range []struct {
		accept []string
		want   bool
	}{
		{nil, true},
		{[]string{"application/json"}, true},
		{[]string{"application/vnd.kubernetes.protobuf, */*"}, true},
		{[]string{"application/vnd.kubernetes.protobuf;type=watch", "application/json"}, true},
		// A Table is asked for by name: the answer keeps that form, and is passed through.
		{[]string{"application/json;as=Table;v=v1;g=meta.k8s.io"}, false},
		{[]string{"application/json;q=0.9"}, true},
		{[]string{"application/*"}, true},
		{[]string{"application/vnd.kubernetes.protobuf"}, false},
		{[]string{"application/cbor"}, false},
	} {
		if got := acceptsJSON(tc.accept); got != tc.want {
			t.Errorf("acceptsJSON(%q) = %v, want %v", tc.accept, got, tc.want)
		}
	}
}

// The events of a watch reach the watcher whole and in order, however the worker's
// stream is cut into reads, and the last resourceVersion passed on is the one to resume
// from.
func TestRelayEventsPassesOnEveryEventWhole(t *testing.T) {
	big := strings.Repeat("x", 8<<10) // larger than any one read
	events := []string{
		`{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"11"}}}`,
		`{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"12","annotations":{"big":"` + big + `"}}}}`,
		`{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"15"}}}`,
		`{"type":"DELETED","object":{"metadata":{"name":"a","resourceVersion":"16"}}}`,
	}
	stream := strings.Join(events, "\n") + "\n"
	for name, reader := range map[string]func() io.Reader{
		"all in one read":  func() io.Reader { return strings.NewReader(stream) },
		"one byte a read":  func() io.Reader { return iotest.OneByteReader(strings.NewReader(stream)) },
		"half a read each": func() io.Reader { return iotest.HalfReader(strings.NewReader(stream)) },
	} {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			var rv string
			if end := relayEvents(flushWriter{rec, http.NewResponseController(rec)}, reader(), &rv); end != endedByWorker {
				t.Errorf("a stream the worker ended cleanly was taken for %v, want %v", end, endedByWorker)
			}
			if got := rec.Body.String(); got != stream {
				t.Errorf("the watcher got %d bytes, want the %d the worker sent", len(got), len(stream))
			}
			if rv != "16" {
				t.Errorf("resume from resourceVersion %q, want 16", rv)
			}
		})
	}
}

// A stream cut in the middle of an event is a broken tunnel, to resume from the last
// event passed on whole.
func TestRelayEventsTellsABrokenStream(t *testing.T) {
	stream := `{"type":"ADDED","object":{"metadata":{"resourceVersion":"7"}}}` + "\n" + `{"type":"MODIFIED","obj`
	rec := httptest.NewRecorder()
	var rv string
	r := io.MultiReader(strings.NewReader(stream), iotest.ErrReader(io.ErrUnexpectedEOF))
	if end := relayEvents(flushWriter{rec, http.NewResponseController(rec)}, r, &rv); end != endedBroken {
		t.Errorf("a stream cut short was taken for %v, want %v", end, endedBroken)
	}
	if rv != "7" {
		t.Errorf("resume from resourceVersion %q, want 7", rv)
	}
}

// filler reads n bytes of 'A', counting what was read.
type filler struct{ n, read int }

func (f *filler) Read(p []byte) (int, error) {
	if f.read >= f.n {
		return 0, io.EOF
	}
	p = p[:min(len(p), f.n-f.read)]
	for i := range p {
		p[i] = 'A'
	}
	f.read += len(p)
	return len(p), nil
}

// An event larger than any object's ends the watch when it outgrows the budget: the
// proxy holds an event whole before passing it on, and the worker, not the proxy, says
// how large it is.
func TestRelayEventsEndsAWatchWhoseEventOutgrowsAnyObject(t *testing.T) {
	rest := &filler{n: 8 * maxWatchEvent}
	body := io.MultiReader(strings.NewReader(`{"type":"ADDED","object":{"metadata":{"resourceVersion":"3"}}}`+"\n"+`{"type":"ADDED","object":{"x":"`), rest)
	rec := httptest.NewRecorder()
	var rv string
	if end := relayEvents(flushWriter{rec, http.NewResponseController(rec)}, body, &rv); end != endedForGood {
		t.Errorf("a watch whose event is too large was taken for %v, want %v", end, endedForGood)
	}
	if rest.read > maxWatchEvent {
		t.Errorf("read %d MiB of one event, past the %d MiB budget", rest.read>>20, maxWatchEvent>>20)
	}
	if rv != "3" || !strings.Contains(rec.Body.String(), `"resourceVersion":"3"`) {
		t.Errorf("the event before the large one was not passed on: %q, resume from %q", rec.Body.String(), rv)
	}
}
