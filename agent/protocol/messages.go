package protocol

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// ProtocolVersion is the newest version this package speaks. The agent announces it in
// the upgrade request; the hub answers with the version the two will speak (Negotiate),
// and both stamp that on their control messages, so an older agent keeps working with a
// newer hub. An agent announcing a version newer than the hub's is refused with a
// message saying so: hubs are upgraded before their agents.
//
// Version 2 adds streams the hub opens to reach the worker's API server (StreamProxy).
const ProtocolVersion = 2

// ProxyVersion is the first version whose agents serve the hub's API proxy streams:
// a worker whose agent speaks less cannot take work dispatched by the hub.
const ProxyVersion = 2

// Negotiate is the version a hub speaking ProtocolVersion and a peer announcing peer
// agree on: the lower of the two.
func Negotiate(peer int) int { return min(peer, ProtocolVersion) }

// Secret is a credential in a message. It prints as "[redacted]" so that logging a
// message never logs the secret in it; only its JSON form carries it.
type Secret string

func (Secret) String() string   { return "[redacted]" }
func (Secret) GoString() string { return "[redacted]" }

// Reveal is the secret itself, for the one place that stores or presents it.
func (s Secret) Reveal() string { return string(s) }

// Path is where the hub serves the tunnel.
const Path = "/v1/agent/connect"

// Headers of the upgrade request and answer.
const (
	HeaderIdentity   = "Flotilla-Identity"
	HeaderAuth       = "Flotilla-Auth"
	HeaderProtocol   = "Flotilla-Protocol"
	HeaderCredential = "Flotilla-Credential"
	// HeaderCredentialExpires comes with HeaderCredential: when the hub stops accepting
	// the credential, in RFC 3339. A hub before credential lifetimes sends none.
	HeaderCredentialExpires = "Flotilla-Credential-Expires"
	// HeaderRedemptionKey carries, with an enrollment token, a random value the agent
	// drew for its redemption and keeps until it holds a credential: presenting the
	// same token with the same key again shortly after is answered with a fresh
	// credential, since the first answer was evidently lost.
	HeaderRedemptionKey = "Flotilla-Redemption-Key"

	AuthEnrollment = "enrollment"
	AuthCredential = "credential"
)

// Message types.
const (
	TypeHello            = "hello"
	TypeDesired          = "desired"
	TypeApplied          = "applied"
	TypeInventory        = "inventory"
	TypeHeartbeat        = "heartbeat"
	TypeRotateCredential = "rotate"
	TypeCredentialStored = "rotated"
	TypeError            = "error"
)

// Envelope is one message on the control stream.
type Envelope struct {
	Version int             `json:"v"`
	Type    string          `json:"type"`
	Body    json.RawMessage `json:"body,omitempty"`
}

// Hello is the agent's first message on a connection.
type Hello struct {
	Identity          string `json:"identity"`
	AgentVersion      string `json:"agentVersion"`
	KubernetesVersion string `json:"kubernetesVersion"`
	// AppliedHash is the desired generation the agent applied last, on this connection
	// or before; empty when it never applied one.
	AppliedHash string `json:"appliedHash,omitempty"`
}

// DesiredState is the whole desired state of a worker cluster.
type DesiredState struct {
	// Generation counts the hub's desired states for the cluster (the WorkerCluster's
	// metadata.generation); Hash is their content, which is what is acknowledged.
	Generation int64  `json:"generation"`
	Hash       string `json:"hash"`
	// Objects in apply order, each a Kubernetes object as JSON.
	Objects []json.RawMessage `json:"objects"`
	// Decommission asks the agent to prune everything it owns and apply nothing.
	Decommission bool `json:"decommission,omitempty"`
	// Components are the Kueue and JobSet the worker must run, which the agent brings
	// about before it applies Objects. Hubs before them send none, and the agent then
	// leaves the worker's Kueue as it finds it.
	Components *components.Spec `json:"components,omitempty"`
	// Dispatch is how far the hub's MultiKueue may reach into the worker through the API
	// proxy once this state is applied. Nil (a hub before it, a fleet without dispatch,
	// a decommission) lets it reach nothing.
	Dispatch *Dispatch `json:"dispatch,omitempty"`
}

// Dispatch scopes the hub's API proxy on the worker (agent/proxy.Scope).
type Dispatch struct {
	// Origin is the hub Kueue's MultiKueue origin: the value of the
	// kueue.x-k8s.io/multikueue-origin label on everything it creates on a worker, and
	// the only one its lists and watches may select.
	Origin string `json:"origin"`
	// Namespaces are the fleet's workload namespaces, where jobs are dispatched. The
	// agent narrows them further (its own namespace, the system namespaces and its
	// administrator's allowlist are never in scope).
	Namespaces []string `json:"namespaces"`
}

// Equal reports whether d and o scope the proxy alike.
func (d *Dispatch) Equal(o *Dispatch) bool {
	if d == nil || o == nil {
		return d == o
	}
	return d.Origin == o.Origin && slices.Equal(d.Namespaces, o.Namespaces)
}

// Action is what applying did to one object.
type Action string

const (
	ActionCreated    Action = "created"
	ActionConfigured Action = "configured"
	ActionUnchanged  Action = "unchanged"
	ActionPruned     Action = "pruned"
	// ActionSkipped: the object exists and is left as it is by design (create-only).
	ActionSkipped Action = "skipped"
	// ActionRefused: an existing object this WorkerCluster does not own.
	ActionRefused Action = "refused"
	ActionFailed  Action = "failed"
)

// ObjectResult is the outcome for one object.
type ObjectResult struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	// UID of the object on the worker, when it exists.
	UID     string `json:"uid,omitempty"`
	Action  Action `json:"action"`
	Message string `json:"message,omitempty"`
}

// Applied reports one application of a desired state.
type Applied struct {
	Generation int64  `json:"generation"`
	Hash       string `json:"hash"`
	// Results are one per object, except that a report of many failures lists the first
	// of them and Error counts them all (see agent/apply): broken objects, however many,
	// do not make a report larger than MaxMessageSize.
	Results []ObjectResult `json:"results"`
	// Error is set when the state was not applied as a whole (e.g. the worker's API
	// server was unreachable); Results then hold what was done before.
	Error string `json:"error,omitempty"`
	// Components are the state of the components the desired state names.
	Components []components.Status `json:"components,omitempty"`
}

// Complete reports whether every component is ready and every object was applied,
// pruned, or left alone by design.
func (a *Applied) Complete() bool {
	if a.Error != "" {
		return false
	}
	for _, c := range a.Components {
		if !c.Ready {
			return false
		}
	}
	for _, r := range a.Results {
		if r.Action == ActionRefused || r.Action == ActionFailed {
			return false
		}
	}
	return true
}

// Inventory is the worker's GPUs as its nodes report them.
type Inventory struct {
	Nodes []NodeGPUs `json:"nodes"`
	// Totals per GPU product over Ready, schedulable nodes.
	Totals []ProductTotal `json:"totals"`
	// UnavailableNodes counts GPU nodes that are not Ready or are unschedulable; their
	// GPUs are not in Totals.
	UnavailableNodes int `json:"unavailableNodes"`
	// Health is set when the agent reads a DCGM exporter.
	Health *GPUHealth `json:"health,omitempty"`
}

// NodeGPUs is one node's GPUs.
type NodeGPUs struct {
	Name string `json:"name"`
	// Capacity and Allocatable of nvidia.com/gpu.
	Capacity    int64 `json:"capacity"`
	Allocatable int64 `json:"allocatable"`
	// From GPU Feature Discovery labels (nvidia.com/gpu.*); empty when absent.
	Product       string `json:"product,omitempty"`
	MemoryMiB     int64  `json:"memoryMiB,omitempty"`
	Count         int64  `json:"count,omitempty"`
	MIGStrategy   string `json:"migStrategy,omitempty"`
	DriverVersion string `json:"driverVersion,omitempty"`
	CUDAVersion   string `json:"cudaVersion,omitempty"`
	Ready         bool   `json:"ready"`
	Unschedulable bool   `json:"unschedulable,omitempty"`
}

// ProductTotal counts one GPU product.
type ProductTotal struct {
	Product string `json:"product"`
	GPUs    int64  `json:"gpus"`
	Nodes   int    `json:"nodes"`
}

// GPUHealth is what a DCGM exporter says of the GPUs.
type GPUHealth struct {
	GPUs []GPUStatus `json:"gpus"`
	// Error is set when the exporter could not be read; GPUs are then empty.
	Error string `json:"error,omitempty"`
}

// GPUStatus is one GPU as DCGM sees it.
type GPUStatus struct {
	Node   string `json:"node,omitempty"`
	GPU    string `json:"gpu"`
	UUID   string `json:"uuid,omitempty"`
	Model  string `json:"model,omitempty"`
	Health string `json:"health"`
	// XIDErrors is the last XID error code reported, 0 for none.
	XIDErrors  int     `json:"xidErrors,omitempty"`
	TempC      float64 `json:"tempC,omitempty"`
	Violations string  `json:"violations,omitempty"`
}

// Heartbeat says the sender is alive.
type Heartbeat struct {
	Time time.Time `json:"time"`
}

// RotateCredential hands the agent a new credential. The hub accepts the old one until
// the agent answers CredentialStored, so a rotation interrupted by a disconnect never
// locks the agent out. The hub may send the same credential again while it waits.
type RotateCredential struct {
	Credential Secret `json:"credential"`
	// ExpiresAt is when the hub stops accepting the new credential; zero (left out) from
	// a hub before credential lifetimes.
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
}

// CredentialStored confirms that the agent stored the new credential.
type CredentialStored struct {
	// Fingerprint of the stored credential's hash, so the hub can tell which one.
	Fingerprint string `json:"fingerprint"`
}

// Error is the answer to a message the receiver refused.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes.
const (
	CodeUnknownType        = "UnknownType"
	CodeUnsupportedVersion = "UnsupportedVersion"
	CodeMalformed          = "Malformed"
)

// redemptionKeyBytes is the randomness of a redemption key: as much as a token's.
const redemptionKeyBytes = 32

// NewRedemptionKey draws the value an agent sends in HeaderRedemptionKey.
func NewRedemptionKey() (Secret, error) {
	var b [redemptionKeyBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("protocol: drawing a redemption key: %w", err)
	}
	return Secret(base64.RawURLEncoding.EncodeToString(b[:])), nil
}

// ValidRedemptionKey reports whether s has the shape NewRedemptionKey gives, so that a
// receiver can refuse anything else before it looks anything up.
func ValidRedemptionKey(s string) bool {
	if len(s) != base64.RawURLEncoding.EncodedLen(redemptionKeyBytes) {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	return err == nil && len(b) == redemptionKeyBytes
}
