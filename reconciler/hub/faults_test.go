package hub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/flotilla-gitops/flotilla/secrets"
)

// Every reader of the repository reads commit statuses: a hub fault posts its kind, and
// never the words of the system that failed.
func TestHubFaultStatusesSayTheKindWithoutTheDetail(t *testing.T) {
	wc := schema.GroupResource{Group: "flotilla.dev", Resource: "workerclusters"}
	const secret = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd"
	tests := []struct {
		name string
		err  error
		kind string
	}{
		{"a key service that does not answer", fmt.Errorf("%w: %s: AccessDenied", secrets.ErrKeyUnavailable, secret), "key service unavailable"},
		{"an admission policy refusing a write", apierrors.NewInvalid(schema.GroupKind{Group: "flotilla.dev", Kind: "WorkerCluster"}, "gpu-a", nil), "the hub cluster refused a write"},
		{"a hub without its RBAC", apierrors.NewForbidden(wc, "gpu-a", errors.New("user "+secret+" cannot update")), "the hub is not allowed to write to its cluster"},
		{"the hub cluster's API throttling", apierrors.NewTooManyRequests(secret, 1), "the hub cluster is throttling the hub"},
		{"the hub cluster's API timing out", fmt.Errorf("writing: %w", context.DeadlineExceeded), "the hub cluster timed out"},
		{"the hub cluster's API unreachable", fmt.Errorf("writing: %w", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New(secret)}), "the hub cluster is unavailable"},
		{"a conflict that outlasted its retries", apierrors.NewConflict(wc, "gpu-a", errors.New(secret)), "conflicting writes to the hub cluster"},
		{"anything else", errors.New(secret), "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := faultDescription(tt.err)
			if want := "hub error, retrying: " + tt.kind + "; see the hub's log"; got != want {
				t.Errorf("status %q, want %q", got, want)
			}
			if strings.Contains(got, secret) || strings.Contains(got, "123456789012") {
				t.Errorf("the status carries the fault's detail: %q", got)
			}
			if d := faultDetail(tt.err); !strings.Contains(d, tt.err.Error()[:min(len(tt.err.Error()), 40)]) {
				t.Errorf("the detail for operators %q lost the error %q", d, tt.err)
			}
		})
	}
	long := errors.New(strings.Repeat("x", 5000))
	if d := faultDetail(long); len(d) > maxFaultDetail+len("…") {
		t.Errorf("a %d-byte error is kept whole on the WorkerCluster (%d bytes)", len(long.Error()), len(d))
	}
}
