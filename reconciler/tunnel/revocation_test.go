package tunnel_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// The merge of `rotate-token --revoke` (a new token and a raised spec.revocation) cuts
// the agent's credential off at once, wherever it is used, and says on the cluster what
// brings the worker back; nothing else of the cluster changes. The new token's agent is
// admitted, its credential stamped with the new count.
func TestARevocationCutsTheCredentialOffAtTheMergeAndTheNewTokenBringsTheAgentBack(t *testing.T) {
	h := startHub(t, nil, nil)
	c := newCluster(t, "revoked")
	p := h.enroll(t, c)
	leaked := p.credential
	h.srv.Push(c.key(), c.identity, &protocol.DesiredState{Generation: 1, Hash: "sha256:kept"})
	eventually(t, "the connection recorded", func() (bool, string) {
		cond := condition(c.wc(t), v1alpha1.ConditionConnected)
		return cond != nil && cond.Status == metav1.ConditionTrue, fmt.Sprintf("Connected %+v", cond)
	})
	if h.srv.EnforceRevocation(c.wc(t)) {
		t.Fatal("a cluster whose revocation did not move was disconnected")
	}

	// The merge.
	fresh, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	wc := c.wc(t)
	wc.Spec.Revocation, wc.Spec.EnrollmentTokenHash = 1, fresh.Hash().String()
	if err := admin().Update(t.Context(), wc); err != nil {
		t.Fatal(err)
	}
	if !h.srv.EnforceRevocation(wc) {
		t.Fatal("the revoked credential's tunnel was not closed")
	}
	eventually(t, "the cluster says its credential was revoked", func() (bool, string) {
		wc = c.wc(t)
		conn, cur, ready := condition(wc, v1alpha1.ConditionConnected), condition(wc, v1alpha1.ConditionCredentialCurrent), condition(wc, v1alpha1.ConditionReady)
		ok := conn != nil && conn.Status == metav1.ConditionFalse && conn.Reason == v1alpha1.ReasonCredentialRevoked &&
			cur != nil && cur.Status == metav1.ConditionFalse && cur.Reason == v1alpha1.ReasonCredentialRevoked &&
			ready != nil && ready.Reason == v1alpha1.ReasonCredentialRevoked
		return ok, fmt.Sprintf("Connected %+v, CredentialCurrent %+v, Ready %+v", conn, cur, ready)
	})
	st := conditions.CommitStatus("flotilla/"+c.name, wc)
	if st.State != commitstatus.Pending || !strings.Contains(st.Description, "values."+c.name+".local.yaml") {
		t.Fatalf("commit status %s %q, want pending, naming the new values file", st.State, st.Description)
	}
	// Refused wherever it is used, with the reason for the operator only.
	h.refused(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: leaked})
	eventually(t, "the refusal logged with its reason", func() (bool, string) {
		return strings.Contains(h.log.String(), "was revoked: it was issued under revocation 0 and the cluster's is 1"), h.log.Last(1000)
	})
	// Nothing else of the cluster changed: what the hub pushed stays, and so does the
	// record of its credential until the new token replaces it.
	if d := h.srv.Desired(c.identity); d == nil || d.Hash != "sha256:kept" {
		t.Fatalf("the desired state after the revocation: %+v", d)
	}
	var sec corev1.Secret
	if err := admin().Get(t.Context(), client.ObjectKey{Namespace: c.ns, Name: tunnel.CredentialSecretName(c.name)}, &sec); err != nil {
		t.Fatalf("the credential Secret: %v", err)
	}

	// The agent installed with the new values file.
	c.token = fresh
	back := h.enroll(t, c)
	eventually(t, "the new credential in force, stamped with the revocation", func() (bool, string) {
		wc = c.wc(t)
		cur := condition(wc, v1alpha1.ConditionCredentialCurrent)
		return cur != nil && cur.Status == metav1.ConditionTrue && wc.Status.Credential != nil && wc.Status.Credential.Revocation == 1,
			fmt.Sprintf("CredentialCurrent %+v, credential %+v", cur, wc.Status.Credential)
	})
	if h.srv.EnforceRevocation(wc) {
		t.Fatal("the new credential's tunnel was closed by the revocation it was issued under")
	}
	h.refused(t, request{identity: c.identity, kind: protocol.AuthCredential, secret: leaked})
	noSecretIn(t, "the hub's log", h.log.String(), leaked, back.credential, fresh.Reveal())
	noSecretIn(t, "the commit status", st.Description, leaked, back.credential, fresh.Reveal())
}
