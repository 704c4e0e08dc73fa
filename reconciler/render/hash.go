package render

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// Hash is the content hash of an object list: SHA-256 over its canonical JSON (keys
// sorted, no insignificant space), in the list's order.
//
// The JSON is what encoding/json's Encoder writes, one line an object, byte for byte:
// the hash is compared with what agents acknowledged and with hashes of earlier
// releases. It is written by encoder, which knows the few types an unstructured
// object is made of and leaves everything else to encoding/json; going through
// encoding/json's reflection for every map of every object was a fifth of a render.
func Hash(objects []*unstructured.Unstructured, comps components.Spec) (string, error) {
	e := encoders.Get().(*encoder)
	defer e.release()
	h := sha256.New()
	for _, o := range objects {
		if err := e.encode(o.Object); err != nil {
			return "", err
		}
		e.buf = append(e.buf, '\n')
		h.Write(e.buf)
	}
	// After the objects, so that the hash of a desired state is told from any object list.
	if err := json.NewEncoder(h).Encode(comps); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// encoder writes one object at a time as json.Marshal does. Its buffers are kept for the
// next object and, through encoders, the next render.
type encoder struct {
	buf []byte
	// keys holds the sorted keys of every map being written, outermost first.
	keys []string
}

var encoders = sync.Pool{New: func() any { return &encoder{} }}

// maxPooledBuffer bounds the buffer an encoder keeps in the pool: one large object of
// one render is no reason for every idle encoder to hold as much.
const maxPooledBuffer = 1 << 20

// release returns e to encoders, without its buffer if that grew above maxPooledBuffer.
func (e *encoder) release() {
	if cap(e.buf) > maxPooledBuffer {
		e.buf = nil
	}
	encoders.Put(e)
}

// encode writes v into buf, in place of what buf held.
func (e *encoder) encode(v any) error {
	e.buf = e.buf[:0]
	err := e.value(v)
	clear(e.keys)
	e.keys = e.keys[:0]
	return err
}

// value appends v as json.Marshal writes it. Maps, lists, strings of plain ASCII,
// integers, booleans and nulls are written here; floats, strings that need escaping and
// any other type are rare enough to be left to json.Marshal, which is then right by
// definition.
func (e *encoder) value(v any) error {
	switch x := v.(type) {
	case nil:
		e.buf = append(e.buf, "null"...)
	case map[string]any:
		if x == nil {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		// This map's keys go after those of the maps it is in; the maps in it add theirs
		// after these and take them off again.
		start := len(e.keys)
		for k := range x {
			e.keys = append(e.keys, k)
		}
		end := len(e.keys)
		slices.Sort(e.keys[start:end])
		e.buf = append(e.buf, '{')
		for i := start; i < end; i++ {
			if i > start {
				e.buf = append(e.buf, ',')
			}
			k := e.keys[i]
			if err := e.string(k); err != nil {
				return err
			}
			e.buf = append(e.buf, ':')
			if err := e.value(x[k]); err != nil {
				return err
			}
		}
		e.buf = append(e.buf, '}')
		e.keys = e.keys[:start]
	case []any:
		if x == nil {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		e.buf = append(e.buf, '[')
		for i, item := range x {
			if i > 0 {
				e.buf = append(e.buf, ',')
			}
			if err := e.value(item); err != nil {
				return err
			}
		}
		e.buf = append(e.buf, ']')
	case string:
		return e.string(x)
	case int64:
		e.buf = strconv.AppendInt(e.buf, x, 10)
	case bool:
		e.buf = strconv.AppendBool(e.buf, x)
	default:
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		e.buf = append(e.buf, data...)
	}
	return nil
}

// string appends s quoted as json.Marshal quotes it: printable ASCII other than the
// quote, the backslash and the three characters it escapes for HTML goes as it is.
func (e *encoder) string(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			data, err := json.Marshal(s)
			if err != nil {
				return err
			}
			e.buf = append(e.buf, data...)
			return nil
		}
	}
	e.buf = append(e.buf, '"')
	e.buf = append(e.buf, s...)
	e.buf = append(e.buf, '"')
	return nil
}
