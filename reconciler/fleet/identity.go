package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// identityHashLen is how many hex digits of SHA-256 stand in for the cut part of a long
// identity: 40 bits, so that two long identities of one hub collide with negligible
// probability.
const identityHashLen = 10

// Identity is the name a worker cluster goes by on the worker and in labels:
// <len(tenant)>-<tenant>-<worker>. The length prefix keeps tenant "a-b" with worker "c"
// apart from tenant "a" with worker "b-c". An identity longer than a label value may be
// is shortened to a prefix and a hash of the whole, so it stays stable and unique instead
// of being cut silently.
func Identity(tenant, worker string) string {
	id := strconv.Itoa(len(tenant)) + "-" + tenant + "-" + worker
	if len(id) <= validation.LabelValueMaxLength {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	prefix := strings.TrimRight(id[:validation.LabelValueMaxLength-identityHashLen-1], "-")
	return prefix + "-" + hex.EncodeToString(sum[:])[:identityHashLen]
}
