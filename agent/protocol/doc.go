// Package protocol is the wire protocol between the hub and a worker cluster's agent.
//
// # Connection
//
// The agent dials the hub: a WebSocket upgrade of GET /v1/agent/connect (wss, or ws on
// loopback when the hub allows it), carrying
//
//	Authorization: Bearer <secret>
//	Flotilla-Identity: <worker identity>            (the flotilla.dev/worker-cluster value)
//	Flotilla-Auth: enrollment | credential           (what the secret is)
//	Flotilla-Protocol: <version>                     (ProtocolVersion of the agent)
//
// The first contact presents the one-shot enrollment token from the fleet repository;
// the hub answers the upgrade with the agent's own credential in the header
// Flotilla-Credential, and from then on the agent presents that credential. A refused
// secret gets 401 with no detail. A protocol version the hub does not speak gets 400
// with a plain-text reason. The hub pings at the heartbeat interval (WebSocket ping
// frames) and drops a peer that stays silent past the heartbeat timeout; so does the
// agent.
//
// # Streams
//
// The WebSocket carries binary messages only; their payloads form one byte stream that
// yamux multiplexes into streams, so later streams can carry Kubernetes API traffic from
// the hub to the worker without a second connection. The agent is the yamux client. It
// opens the first stream, the control stream, right after the upgrade; the hub may open
// further streams, and the agent refuses kinds it does not know.
//
// # Control stream
//
// Each message is a 4-byte big-endian length followed by that many bytes of JSON, an
// Envelope: {"v": version, "type": type, "body": {...}}. A message longer than
// MaxMessageSize is not read: the stream is closed with ErrTooLarge. A receiver answers
// an unknown type or a newer version with an Error message and carries on.
//
//	agent → hub  hello        Hello: identity, versions, the hash it last applied
//	hub → agent  desired      DesiredState: generation, hash and every object
//	agent → hub  applied      Applied: the hash applied, one result per object
//	agent → hub  inventory    Inventory: GPUs per node and in total
//	both         heartbeat    Heartbeat: liveness above the transport's pings
//	hub → agent  rotate       RotateCredential: a new credential to store
//	agent → hub  rotated      CredentialStored: the new credential is stored; the old
//	                          one may be forgotten
//	both         error        Error: what the peer sent that the receiver refused
//
// The hub sends the whole desired state on every (re)connect and again periodically;
// the agent applies it whole and acknowledges the hash. There is no event stream to
// lose messages from: a lost message is repaired by the next whole state.
package protocol
