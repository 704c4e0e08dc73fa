package tunnel

import "testing"

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
