package render

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
)

// TestHashEncoderWritesWhatEncodingJSONWrites pins the hash's canonical JSON to
// encoding/json's, byte for byte, on every type and string an object may hold.
func TestHashEncoderWritesWhatEncodingJSONWrites(t *testing.T) {
	for _, v := range []any{
		nil, true, false, int64(0), int64(-42), int64(math.MaxInt64), int64(math.MinInt64),
		0.0, 1.5, -2.25e-7, 1e21, 123456789.125, float64(math.MaxFloat64), math.SmallestNonzeroFloat64,
		"", "plain", `quote " and \ backslash`, "<html> & co", "tab\tnew\nline\r\x00\x1f\x7f",
		"ünïcødé", "\u2028\u2029", "bad \xff utf-8", "emoji 🚢",
		[]any(nil), []any{}, map[string]any(nil), map[string]any{},
		int(7), int32(8), uint8(9), float32(0.1), map[string]string{"b": "1", "a": "<"}, []string{"x"},
		map[string]any{
			"b": []any{int64(1), "two", 3.5, nil, map[string]any{"z": true, "<a>": []any(nil)}},
			"a": map[string]any{"é": "é", "e": map[string]any(nil), "": ""},
		},
	} {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		e := &encoder{buf: []byte("left from the object before")}
		if err := e.encode(v); err != nil {
			t.Fatalf("%#v: %v", v, err)
		}
		if !bytes.Equal(e.buf, want) {
			t.Errorf("%#v: got %s, encoding/json writes %s", v, e.buf, want)
		}
		if len(e.keys) != 0 {
			t.Errorf("%#v: %d keys left behind", v, len(e.keys))
		}
	}
}

func TestHashEncoderFailsWhereEncodingJSONFails(t *testing.T) {
	for _, v := range []any{math.NaN(), math.Inf(1), map[string]any{"a": []any{math.Inf(-1)}}, make(chan int)} {
		if _, err := json.Marshal(v); err == nil {
			t.Fatalf("%#v: encoding/json writes it", v)
		}
		if err := (&encoder{}).encode(v); err == nil {
			t.Errorf("%#v: written, but encoding/json refuses it", v)
		}
	}
}

// TestHashEncoderDropsLargeBuffers pins that an encoder goes back to the pool without a
// buffer above maxPooledBuffer, and with a smaller one.
func TestHashEncoderDropsLargeBuffers(t *testing.T) {
	large := &encoder{buf: make([]byte, 0, maxPooledBuffer+1)}
	large.release()
	if large.buf != nil {
		t.Errorf("an encoder went back to the pool with a buffer of %d bytes", cap(large.buf))
	}
	small := &encoder{buf: make([]byte, 0, 4096)}
	small.release()
	if cap(small.buf) != 4096 {
		t.Errorf("an encoder went back to the pool without its buffer of 4096 bytes")
	}
}
