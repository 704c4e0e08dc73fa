// Package servingca is the hub's own certificate authority for the TLS of its
// Kubernetes API proxy: Kueue on the hub reaches every worker at
// https://<proxy>/clusters/<identity>, trusting the CA bundle that the hub writes into
// each worker's kubeconfig Secret.
//
// The authority lives in one Secret on the hub cluster, so that every replica serves
// the same certificate and a restarted hub keeps its CA. Nothing outside this package
// reads the keys in it. Rotation never cuts a client off:
//
//   - a new CA is made when the newest one has a third of its life left, and joins the
//     trust bundle at once;
//   - it starts signing only after Options.Overlap, time for the bundle to reach every
//     kubeconfig Secret and for Kueue to reload it;
//   - the serving certificate is reissued when a third of its life is left, when the
//     signing CA changed, or when the proxy's names changed;
//   - a CA leaves the bundle when it expires.
//
// Replicas that rotate at once do not fight: writes carry the Secret's
// resourceVersion, and the loser reads the winner's result.
package servingca
