package fleet_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

func TestIdentityIsLengthTenantAndWorker(t *testing.T) {
	for _, tc := range []struct{ tenant, worker, want string }{
		{"example", "example-us-central1", "7-example-example-us-central1"},
		{"a", "b", "1-a-b"},
		{"acme-research", "gpu-00042", "13-acme-research-gpu-00042"},
	} {
		if got := fleet.Identity(tc.tenant, tc.worker); got != tc.want {
			t.Errorf("Identity(%q, %q) = %q, want %q", tc.tenant, tc.worker, got, tc.want)
		}
	}
}

func TestIdentityIsUnambiguous(t *testing.T) {
	pairs := [][2][2]string{
		{{"a-b", "c"}, {"a", "b-c"}},
		{{"a-b-c", "d"}, {"a", "b-c-d"}},
		{{"team-1", "x"}, {"team", "1-x"}},
	}
	for _, p := range pairs {
		x, y := fleet.Identity(p[0][0], p[0][1]), fleet.Identity(p[1][0], p[1][1])
		if x == y {
			t.Errorf("tenant %q with worker %q and tenant %q with worker %q share the identity %q",
				p[0][0], p[0][1], p[1][0], p[1][1], x)
		}
	}
	if got := fleet.Identity("a-b", "c"); got != "3-a-b-c" {
		t.Errorf(`Identity("a-b", "c") = %q`, got)
	}
	if got := fleet.Identity("a", "b-c"); got != "1-a-b-c" {
		t.Errorf(`Identity("a", "b-c") = %q`, got)
	}
}

func TestIdentityOverALabelIsShortenedWithAStableHash(t *testing.T) {
	const limit = validation.LabelValueMaxLength
	tenant := strings.Repeat("t", 30)
	// 3 + 30 + 1 + worker: a worker of 29 characters fills a label exactly.
	exact := fleet.Identity(tenant, strings.Repeat("w", 29))
	if len(exact) != limit || exact != "30-"+tenant+"-"+strings.Repeat("w", 29) {
		t.Fatalf("identity of exactly %d characters was changed to %q", limit, exact)
	}

	long := strings.Repeat("w", 30)
	id := fleet.Identity(tenant, long)
	if len(id) > limit {
		t.Fatalf("identity %q is %d characters", id, len(id))
	}
	if msgs := validation.IsValidLabelValue(id); len(msgs) > 0 {
		t.Fatalf("identity %q is not a label value: %v", id, msgs)
	}
	if !strings.HasPrefix(id, "30-"+tenant+"-") {
		t.Fatalf("shortened identity %q does not start with the length and tenant", id)
	}
	if again := fleet.Identity(tenant, long); again != id {
		t.Fatalf("identity is not stable: %q, then %q", id, again)
	}
	// Workers that differ only in the part that is cut still differ.
	if other := fleet.Identity(tenant, strings.Repeat("w", 29)+"x"); other == id {
		t.Fatalf("workers differing at the end share the identity %q", id)
	}
}

func TestIdentityIsAlwaysAValidDistinctLabel(t *testing.T) {
	seen := map[string][2]string{}
	names := func(n int) []string {
		var out []string
		for _, base := range []string{"a", "b-", "x9-"} {
			s := strings.Repeat(base, n/len(base)+1)[:n]
			s = strings.TrimRight(s, "-")
			if s == "" {
				continue
			}
			out = append(out, s)
		}
		return out
	}
	for tl := 1; tl <= 63; tl += 3 {
		for wl := 1; wl <= 63; wl += 2 {
			for _, tenant := range names(tl) {
				for _, worker := range names(wl) {
					id := fleet.Identity(tenant, worker)
					if len(id) > validation.LabelValueMaxLength {
						t.Fatalf("Identity(%q, %q) = %q is %d characters", tenant, worker, id, len(id))
					}
					if msgs := validation.IsValidLabelValue(id); len(msgs) > 0 {
						t.Fatalf("Identity(%q, %q) = %q is not a label value: %v", tenant, worker, id, msgs)
					}
					if msgs := validation.IsDNS1123Label(id); len(msgs) > 0 {
						t.Fatalf("Identity(%q, %q) = %q is not a DNS label: %v", tenant, worker, id, msgs)
					}
					in := [2]string{tenant, worker}
					if prev, dup := seen[id]; dup && prev != in {
						t.Fatalf("Identity %q of %v is also that of %v", id, in, prev)
					}
					seen[id] = in
				}
			}
		}
	}
	if len(seen) < 1000 {
		t.Fatalf("only %d identities checked", len(seen))
	}
}
