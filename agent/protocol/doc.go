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
//	Flotilla-Redemption-Key: <key>                   (with an enrollment token; optional)
//
// The first contact presents the one-shot enrollment token from the fleet repository;
// the hub answers the upgrade with the agent's own credential in the header
// Flotilla-Credential, and when it expires in Flotilla-Credential-Expires (RFC 3339),
// and from then on the agent presents that credential. Tokens and
// credentials have one shape (flt1_, 64 characters, with a checksum) and the identity
// is a label value: the hub refuses anything of another shape before it looks anything
// up. A refused secret gets 401 with no detail. A protocol version the hub does not
// speak gets 400 with a plain-text reason. The hub answers the upgrade with
// Flotilla-Protocol too: the version both speak from then on (Negotiate); a hub that
// does not send it speaks version 1. The hub pings at the heartbeat interval
// (WebSocket ping frames) and drops a peer that stays silent past the heartbeat
// timeout; so does the agent.
//
// The hub's address is judged by one rule on both sides and in fleet.yaml
// (CheckHubURL): wss:// with a host, ws:// only to a loopback host (IsLoopbackHost) and
// only where insecure loopback is allowed, no credentials, query or fragment; the hub
// accepts plain ws:// only from a loopback peer (IsLoopbackAddr), when allowed.
//
// # Redemption
//
// A redemption is one-shot: the hub records it before it answers, so an answer lost on
// the way (a proxy that fails, a connection cut) would burn the token. To recover, the
// agent draws a redemption key (NewRedemptionKey: 32 random bytes, base64url without
// padding) before its first attempt, keeps it until it holds a credential (the agent
// stores it beside where the credential goes), and sends it with every attempt with
// that token. The hub keeps only a hash of the key with the redemption. Presenting the
// redeemed token again with the same key within the hub's retry window (5 minutes by
// default, counted from the first redemption) is answered with a fresh credential, which
// replaces the one that was lost; the token with any other key, or with none, or after
// the window, is refused like any replay. Once the agent has said hello, on any
// connection, it evidently holds its credential, and the hub forgets the key. An agent
// that sends no key gets the one-shot behaviour alone.
//
// A redeemed token stays refused also after its cluster is removed from the fleet and
// added back with the same enrollment file: the hub keeps a record of the tokens a
// cluster redeemed beyond the cluster's removal. Such a cluster needs a new token
// (flotilla cluster rotate-token).
//
// # Credential lifetimes
//
// Every credential has a lifetime (fleet.yaml's credentialLifetime, or a cluster.yaml's;
// 90 days by default). The hub rotates it over the live tunnel long before it ends:
// daily, or at half its lifetime when that is sooner, counted from its issue. It sends
// RotateCredential with the new credential and its expiry, accepts both the old and the
// new one until the agent answers CredentialStored, and sends the same new credential
// again while no answer comes. The agent stores the expiry beside the credential. A
// credential past its expiry is refused like any other (401, no detail); the agent,
// knowing the expiry itself, says in its log that its credential expired and that the
// cluster needs a new enrollment token (flotilla cluster rotate-token). An agent of a
// hub that recorded no expiries holds none: the hub counts its credential's lifetime
// from when it first sees the agent after the upgrade, so nothing expires at once.
// Older agents ignore the expiry, which they never read, and keep working.
//
// # Streams
//
// The WebSocket carries binary messages only; their payloads form one byte stream that
// yamux multiplexes into streams. The agent is the yamux client. It opens the first
// stream, the control stream, right after the upgrade, and no other: the hub closes a
// tunnel on which the agent opens a second, since it would never accept it, and yamux
// would hold what the agent sent on it for as long as the tunnel lives. From version 2
// on the hub opens further streams, each starting with one byte, its StreamKind; the
// agent closes a stream of a kind it does not serve, and an agent of version 1 closes
// them all.
// A StreamProxy stream carries the HTTP/1.1 requests of the hub's Kubernetes API proxy,
// one connection's worth, so that Kueue's MultiKueue on the hub reaches the worker's API
// server without the worker's credentials leaving the worker; the agent forwards only
// what MultiKueue needs, under an identity of its own.
//
// # Control stream
//
// Each message is a 4-byte big-endian length followed by that many bytes of JSON, an
// Envelope: {"v": version, "type": type, "body": {...}}. A message longer than
// MaxMessageSize is not read: the stream is closed with ErrTooLarge. Until the hello,
// the hub's cap is MaxHelloSize: a larger first message closes the tunnel. Until the hub
// has read the hello, the control stream may carry no more than a hello at its largest
// and its length prefix, whatever the messages, since yamux's window would let an agent
// have the hub hold four times that before it knows who the agent is: more closes the
// tunnel. A receiver allocates a message as its bytes arrive, not as its length prefix
// announces. A receiver answers an unknown type or a newer version with an Error
// message and carries on.
//
//	agent → hub  hello        Hello: identity, versions, the hash it last applied
//	hub → agent  desired      DesiredState: generation, hash, every object, the
//	                          Kueue and JobSet the worker runs (components.Spec), and
//	                          the scope of the hub's API proxy: its MultiKueue origin
//	                          and the workload namespaces (Dispatch)
//	agent → hub  applied      Applied: the hash applied, one result per object, and
//	                          each component's state
//	agent → hub  inventory    Inventory: GPUs per node and in total
//	both         heartbeat    Heartbeat: liveness above the transport's pings
//	hub → agent  rotate       RotateCredential: a new credential to store, and its expiry
//	agent → hub  rotated      CredentialStored: the new credential is stored; the old
//	                          one may be forgotten
//	both         error        Error: what the peer sent that the receiver refused
//
// The hub sends the whole desired state on every (re)connect and again periodically;
// the agent applies it whole and acknowledges the hash. There is no event stream to
// lose messages from: a lost message is repaired by the next whole state. While a
// component is not ready yet the agent applies and reports the same state again every
// half minute on its own, so that the cluster turns ready without the hub's asking.
//
// Every write has a deadline (the hub's is 30 seconds by default): a peer that stops
// reading is disconnected instead of holding the writer, and the hub records the
// cluster as not connected, with reason SendTimeout.
package protocol
