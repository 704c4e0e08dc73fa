package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// The checks on the objects themselves, beyond what a request's path says: a create
// must carry the hub's origin; a read, an update, a patch and a delete must concern an
// object that carries it, read on the live object, and the write is sent with that
// object's UID as a precondition, so that an object replaced in between (deleted and
// made again under the same name, without the label) is not the one written. Bodies and
// answers are held in memory while checked: at most MaxInspecting at a time, each at
// most MaxBodyBytes.

// Media types of request bodies the proxy reads.
const (
	mediaJSON     = "application/json"
	mediaMerge    = "application/merge-patch+json"
	mediaApply    = "application/apply-patch+yaml"
	mediaProtobuf = "application/vnd.kubernetes.protobuf"
)

// httpError is an answer the proxy gives instead of forwarding.
type httpError struct {
	code   int
	reason metav1.StatusReason
	msg    string
}

func (e *httpError) write(w http.ResponseWriter) {
	writeStatus(w, e.code, e.reason, "flotilla-agent: "+e.msg)
}

func forbid(format string, args ...any) *httpError {
	return &httpError{code: http.StatusForbidden, reason: metav1.StatusReasonForbidden, msg: fmt.Sprintf(format, args...)}
}

// inspect holds a slot for a body or an answer held in memory, waiting for one if
// need be: the slots bound the agent's memory, not the requests.
func (h *Handler) inspect(ctx context.Context) (release func(), err error) {
	select {
	case h.inspecting <- struct{}{}:
		return func() { <-h.inspecting }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// guard checks a create, update, patch or delete on what it carries and on the live
// object, rewriting r's body with the UID precondition; nil lets r through.
func (h *Handler) guard(r *http.Request, req request, sc *scope) *httpError {
	switch req.verb {
	case "create", "update", "patch", "delete":
	default:
		return nil
	}
	release, err := h.inspect(r.Context())
	if err != nil {
		return &httpError{code: http.StatusServiceUnavailable, reason: metav1.StatusReasonServiceUnavailable, msg: "the request ended while waiting"}
	}
	defer release()
	body, herr := h.readBody(r)
	if herr != nil {
		return herr
	}
	if req.verb == "create" {
		obj, herr := decodeObject(r.Header.Get("Content-Type"), body)
		if herr != nil {
			return herr
		}
		if got := labelOf(obj, OriginLabel); got != sc.origin {
			return forbid("a create must carry the label %s=%s (it carries %q)", OriginLabel, sc.origin, protocol.Clip(got))
		}
		setBody(r, body, r.Header.Get("Content-Type"))
		return nil
	}

	live, herr := h.live(r.Context(), req, sc)
	if herr != nil {
		return herr
	}
	uid := live.UID
	switch req.verb {
	case "delete":
		opts := map[string]any{}
		if len(bytes.TrimSpace(body)) > 0 {
			if opts, herr = decodeObject(r.Header.Get("Content-Type"), body); herr != nil {
				return herr
			}
		} else {
			opts["apiVersion"], opts["kind"] = "meta.k8s.io/v1", "DeleteOptions"
		}
		if herr := pinUID(child(opts, "preconditions"), uid, req); herr != nil {
			return herr
		}
		return encodeBody(r, opts, mediaJSON)
	case "update":
		obj, herr := decodeObject(r.Header.Get("Content-Type"), body)
		if herr != nil {
			return herr
		}
		if got := labelOf(obj, OriginLabel); got != sc.origin {
			return forbid("an update must keep the label %s=%s (it carries %q)", OriginLabel, sc.origin, protocol.Clip(got))
		}
		if herr := pinUID(child(obj, "metadata"), uid, req); herr != nil {
			return herr
		}
		return encodeBody(r, obj, mediaJSON)
	default: // patch
		media := mediaType(r.Header.Get("Content-Type"))
		if media != mediaApply && media != mediaMerge {
			return forbid("only server-side apply and merge patches are forwarded, not %s", protocol.Clip(media))
		}
		obj, herr := decodeObject(media, body)
		if herr != nil {
			return herr
		}
		// A patch that names the label may only name the hub's origin: it would
		// otherwise take the object out of the hub's reach, or take it over for another.
		if meta, _ := obj["metadata"].(map[string]any); meta != nil {
			if ls, _ := meta["labels"].(map[string]any); ls != nil {
				if v, named := ls[OriginLabel]; named && v != sc.origin {
					return forbid("a patch may not change the label %s", OriginLabel)
				}
			}
		}
		meta := child(obj, "metadata")
		if herr := pinUID(meta, uid, req); herr != nil {
			return herr
		}
		// A subresource's patch drops what it says of metadata, uid included: the
		// resource version, which the API server compares before anything else, is
		// the precondition that holds there too. It is stricter than the UID (any
		// change since the read refuses it, and MultiKueue retries), for the few
		// milliseconds between the read and the write.
		if rv, _ := meta["resourceVersion"].(string); rv == "" {
			meta["resourceVersion"] = live.ResourceVersion
		}
		// An apply patch goes on as JSON, which is YAML.
		return encodeBody(r, obj, media)
	}
}

// live reads the metadata of the live object req concerns, as the dispatch identity, and
// returns it if the object carries the hub's origin.
func (h *Handler) live(ctx context.Context, req request, sc *scope) (*metav1.PartialObjectMetadata, *httpError) {
	resource, _, _ := strings.Cut(req.resource, "/")
	path := "/apis/" + req.group + "/" + req.version
	if req.group == "" {
		path = "/api/" + req.version
	}
	path += "/namespaces/" + req.namespace + "/" + resource + "/" + req.name
	u := *h.target
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	get, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, &httpError{code: http.StatusBadGateway, reason: metav1.StatusReasonServiceUnavailable, msg: "the live object could not be read"}
	}
	// Its metadata only, whatever the object's size.
	get.Header.Set("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json")
	resp, err := h.direct.Do(get)
	if err != nil {
		h.log.Warn("the worker's API server did not answer a read of a live object", "path", path, "error", err)
		return nil, &httpError{code: http.StatusBadGateway, reason: metav1.StatusReasonServiceUnavailable, msg: "the worker's API server did not answer"}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, h.maxBody+1))
	if err != nil || int64(len(data)) > h.maxBody {
		return nil, &httpError{code: http.StatusBadGateway, reason: metav1.StatusReasonServiceUnavailable, msg: "the live object could not be read"}
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, &httpError{code: http.StatusNotFound, reason: metav1.StatusReasonNotFound, msg: fmt.Sprintf("%s %q not found", resource, req.name)}
	case resp.StatusCode != http.StatusOK:
		return nil, &httpError{code: resp.StatusCode, reason: metav1.StatusReasonUnknown, msg: fmt.Sprintf("reading the live object: HTTP %d", resp.StatusCode)}
	}
	var live metav1.PartialObjectMetadata
	if err := json.Unmarshal(data, &live); err != nil || live.UID == "" {
		return nil, &httpError{code: http.StatusBadGateway, reason: metav1.StatusReasonServiceUnavailable, msg: "the live object could not be read"}
	}
	if got := live.Labels[OriginLabel]; got != sc.origin {
		return nil, forbid("%s %s/%s does not carry the label %s=%s: the hub's Kueue did not create it", resource, req.namespace, req.name, OriginLabel, sc.origin)
	}
	return &live, nil
}

// checkAnswer is the reverse proxy's ModifyResponse: the answer to a read of one
// object is replaced with a refusal if the object does not carry the hub's origin.
func (h *Handler) checkAnswer(resp *http.Response) error {
	chk, _ := resp.Request.Context().Value(answerCheckKey{}).(*answerCheck)
	if chk == nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	release, err := h.inspect(resp.Request.Context())
	if err != nil {
		return err
	}
	defer release()
	data, err := io.ReadAll(io.LimitReader(resp.Body, h.maxBody+1))
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	var refusal *httpError
	// Only what is checked is decoded: the rest of the object, managedFields above all,
	// is skipped, not built.
	var obj struct {
		Metadata struct {
			Name      string            `json:"name"`
			Namespace string            `json:"namespace"`
			Labels    map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	switch {
	case int64(len(data)) > h.maxBody:
		refusal = &httpError{code: http.StatusBadGateway, reason: metav1.StatusReasonServiceUnavailable, msg: "the object is larger than the proxy reads"}
	case mediaType(resp.Header.Get("Content-Type")) != mediaJSON || json.Unmarshal(data, &obj) != nil:
		refusal = &httpError{code: http.StatusBadGateway, reason: metav1.StatusReasonServiceUnavailable, msg: "the worker's API server answered in a form the proxy does not read"}
	case obj.Metadata.Labels[OriginLabel] != chk.origin || obj.Metadata.Namespace != chk.req.namespace || obj.Metadata.Name != chk.req.name:
		refusal = forbid("%s %s/%s does not carry the label %s=%s: the hub's Kueue did not create it", chk.req.resource, chk.req.namespace, chk.req.name, OriginLabel, chk.origin)
	}
	if refusal == nil {
		resp.Body = io.NopCloser(bytes.NewReader(data))
		resp.ContentLength = int64(len(data))
		resp.Header.Set("Content-Length", strconv.Itoa(len(data)))
		return nil
	}
	h.refuseLog(resp.Request, refusal.msg)
	rec := statusBody(refusal.code, refusal.reason, "flotilla-agent: "+refusal.msg)
	resp.StatusCode, resp.Status = refusal.code, fmt.Sprintf("%d %s", refusal.code, http.StatusText(refusal.code))
	resp.Body = io.NopCloser(bytes.NewReader(rec))
	resp.ContentLength = int64(len(rec))
	resp.Header = http.Header{"Content-Type": {"application/json"}, "X-Content-Type-Options": {"nosniff"}, "Content-Length": {strconv.Itoa(len(rec))}}
	return nil
}

// answerCheckKey carries, in a read's context, what checkAnswer checks its answer
// against.
type answerCheckKey struct{}

type answerCheck struct {
	origin string
	req    request
}

// readBody reads r's body, which ServeHTTP has capped at MaxBodyBytes.
func (h *Handler) readBody(r *http.Request) ([]byte, *httpError) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return nil, &httpError{code: http.StatusRequestEntityTooLarge, reason: metav1.StatusReasonRequestEntityTooLarge, msg: fmt.Sprintf("the request body is larger than %d bytes", mbe.Limit)}
	}
	if err != nil {
		return nil, &httpError{code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest, msg: "the request body could not be read"}
	}
	return body, nil
}

// decodeObject reads a body as the API server would, into its JSON form. Kubernetes'
// own kinds come as protobuf from controller-runtime's clients, Kueue's and JobSet's as
// JSON.
func decodeObject(contentType string, body []byte) (map[string]any, *httpError) {
	unsupported := &httpError{code: http.StatusUnsupportedMediaType, reason: metav1.StatusReasonUnsupportedMediaType,
		msg: fmt.Sprintf("a body of type %q is not forwarded", protocol.Clip(contentType))}
	malformed := &httpError{code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest, msg: "the request body does not decode"}
	var obj map[string]any
	switch mediaType(contentType) {
	case mediaJSON, mediaMerge:
		if json.Unmarshal(body, &obj) != nil || obj == nil {
			return nil, malformed
		}
	case mediaApply:
		data, err := yaml.YAMLToJSON(body)
		if err != nil || json.Unmarshal(data, &obj) != nil || obj == nil {
			return nil, malformed
		}
	case mediaProtobuf:
		decoded, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		if err != nil {
			return nil, malformed
		}
		if obj, err = runtime.DefaultUnstructuredConverter.ToUnstructured(decoded); err != nil {
			return nil, malformed
		}
		obj["apiVersion"], obj["kind"] = gvk.GroupVersion().String(), gvk.Kind
	default:
		return nil, unsupported
	}
	return obj, nil
}

// pinUID sets m's uid: an object's metadata.uid, which the API server holds immutable
// (an update of an object of another UID is refused), or a delete's precondition. A
// request that names another UID itself is a conflict.
func pinUID(m map[string]any, uid types.UID, req request) *httpError {
	if given, ok := m["uid"].(string); ok && given != "" && given != string(uid) {
		return conflict(req)
	}
	m["uid"] = string(uid)
	return nil
}

// child is the mapping under key in m, made when missing (or not a mapping).
func child(m map[string]any, key string) map[string]any {
	c, _ := m[key].(map[string]any)
	if c == nil {
		c = map[string]any{}
		m[key] = c
	}
	return c
}

func conflict(req request) *httpError {
	return &httpError{code: http.StatusConflict, reason: metav1.StatusReasonConflict,
		msg: fmt.Sprintf("the request names another %s %s/%s than the live one", req.resource, req.namespace, req.name)}
}

func encodeBody(r *http.Request, obj any, contentType string) *httpError {
	data, err := json.Marshal(obj)
	if err != nil {
		return &httpError{code: http.StatusBadRequest, reason: metav1.StatusReasonBadRequest, msg: "the request body could not be encoded"}
	}
	setBody(r, data, contentType)
	return nil
}

func setBody(r *http.Request, data []byte, contentType string) {
	r.Body = io.NopCloser(bytes.NewReader(data))
	r.ContentLength = int64(len(data))
	r.Header.Set("Content-Length", strconv.Itoa(len(data)))
	r.Header.Set("Content-Type", contentType)
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
}

// labelOf is the object's label key, or "".
func labelOf(obj map[string]any, key string) string {
	meta, _ := obj["metadata"].(map[string]any)
	ls, _ := meta["labels"].(map[string]any)
	v, _ := ls[key].(string)
	return v
}

func mediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return ""
	}
	return mt
}
