package hub

import (
	"context"
	"errors"
	"net"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/flotilla-gitops/flotilla/secrets"
)

// A commit status is read by everyone who can read the repository, and a hub fault's
// raw text can name a key service's key ARNs, the hub cluster's addresses or an
// admission policy's message. So a status says only which kind of fault it was; the
// detail goes to the hub's log and to the WorkerCluster (HubErrorAnnotation), where
// operators look.

// faultKind names a hub fault for a commit status.
func faultKind(err error) string {
	var netErr net.Error
	switch {
	case errors.Is(err, secrets.ErrKeyUnavailable):
		return "key service unavailable"
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return "the hub cluster timed out"
	case apierrors.IsTooManyRequests(err):
		return "the hub cluster is throttling the hub"
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return "the hub is not allowed to write to its cluster"
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return "the hub cluster refused a write"
	case apierrors.IsConflict(err):
		return "conflicting writes to the hub cluster"
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err), errors.As(err, &netErr):
		return "the hub cluster is unavailable"
	}
	return "internal error"
}

// faultDescription is the commit status of a hub fault.
func faultDescription(err error) string {
	return "hub error, retrying: " + faultKind(err) + "; see the hub's log"
}

// maxFaultDetail bounds the detail kept on a WorkerCluster.
const maxFaultDetail = 1024

func faultDetail(err error) string {
	msg := err.Error()
	if len(msg) > maxFaultDetail {
		msg = msg[:maxFaultDetail] + "…"
	}
	return msg
}
