package servingca

import (
	"crypto/x509"
	"testing"
	"time"
)

const day = 24 * time.Hour

var testPolicy = policy{hosts: []string{"hub.example.com", "127.0.0.1"}, caValidity: 300 * day, certValidity: 30 * day, overlap: day}

// verifies reports whether the serving certificate of st verifies against the CAs of
// trusted at now, for the policy's first host.
func verifies(t *testing.T, trusted, st state, now time.Time) bool {
	t.Helper()
	pool := x509.NewCertPool()
	for _, ca := range trusted.cas {
		pool.AddCert(ca.cert)
	}
	_, err := st.serving.cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "hub.example.com", CurrentTime: now})
	return err == nil
}

// TestRotationNeverServesACertificateTheLastBundleDoesNotTrust walks a CA's whole life
// in steps of a day, as the hub's periodic reconcile would, and checks the property
// clients rely on: the certificate served after a step verifies against the bundle
// published before it, so a client that has not yet reloaded its kubeconfig is never
// cut off.
func TestRotationNeverServesACertificateTheLastBundleDoesNotTrust(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st, changed, err := rotate(state{}, start, testPolicy)
	if err != nil || !changed {
		t.Fatalf("first rotate: changed %v, err %v", changed, err)
	}
	if len(st.cas) != 1 || !verifies(t, st, st, start) {
		t.Fatalf("a fresh authority: %d CAs, serving cert verifies: %v", len(st.cas), verifies(t, st, st, start))
	}
	first := st.cas[0].cert
	var caRotations, certRotations int
	var sawTwo bool
	for now := start.Add(day); now.Before(start.Add(2 * 300 * day)); now = now.Add(day) {
		prev := st
		st, changed, err = rotate(prev, now, testPolicy)
		if err != nil {
			t.Fatal(err)
		}
		if !changed && (len(st.cas) != len(prev.cas) || st.serving != prev.serving) {
			t.Fatalf("%s: reported no change but changed", now)
		}
		if !verifies(t, prev, st, now) {
			t.Fatalf("%s: the served certificate does not verify against the bundle published a day before", now)
		}
		if st.cas[0].cert != prev.cas[0].cert {
			caRotations++
		}
		if st.serving != prev.serving {
			certRotations++
		}
		if len(st.cas) == 2 {
			sawTwo = true
		}
		for _, ca := range st.cas {
			if !now.Before(ca.cert.NotAfter) {
				t.Fatalf("%s: an expired CA stays in the bundle", now)
			}
		}
		if remaining(st.serving.cert, now) < testPolicy.certValidity/3-day {
			t.Fatalf("%s: the serving certificate has only %s left", now, remaining(st.serving.cert, now))
		}
	}
	if caRotations < 2 || !sawTwo || certRotations < 20 {
		t.Fatalf("over two CA lives: %d CA rotations (want ≥ 2), two CAs trusted at once: %v, %d serving rotations", caRotations, sawTwo, certRotations)
	}
	if st.cas[len(st.cas)-1].cert == first {
		t.Fatal("the first CA is still trusted after it expired")
	}
}

func TestTheServingCertificateIsReissued(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base, _, err := rotate(state{}, now, testPolicy)
	if err != nil {
		t.Fatal(err)
	}
	other := testPolicy
	other.hosts = []string{"proxy.example.com"}
	for _, tc := range []struct {
		name    string
		at      time.Time
		p       policy
		reissue bool
	}{
		{"not while it has most of its life", now.Add(5 * day), testPolicy, false},
		{"when a third of its life is left", now.Add(21 * day), testPolicy, true},
		{"when the proxy's names change", now.Add(day), other, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, err := rotate(base, tc.at, tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.serving != base.serving; got != tc.reissue {
				t.Fatalf("reissued %v, want %v", got, tc.reissue)
			}
			if got := names(st.serving.cert); len(got) != len(tc.p.hosts) {
				t.Fatalf("names %v, want %v", got, tc.p.hosts)
			}
		})
	}
}

func TestTheSecretRoundTripsAndCorruptionIsAnError(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st, _, err := rotate(state{}, now, testPolicy)
	if err != nil {
		t.Fatal(err)
	}
	data, err := encode(st)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, changed, _ := rotate(back, now, testPolicy); changed {
		t.Fatal("a decoded state rotates again at once")
	}
	for name, edit := range map[string]func(map[string][]byte){
		"a key missing": func(d map[string][]byte) { delete(d, keyCAKeys) },
		"garbage": func(d map[string][]byte) {
			d[keyCACerts] = []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
		},
		"swapped key types": func(d map[string][]byte) { d[keyCAKeys] = d[keyCACerts] },
		"another key":       func(d map[string][]byte) { d[keyCAKeys] = d[keyTLSKey] },
	} {
		t.Run(name, func(t *testing.T) {
			d := map[string][]byte{}
			for k, v := range data {
				d[k] = v
			}
			edit(d)
			if _, err := decode(d); err == nil {
				t.Fatal("decoded a corrupted Secret")
			}
		})
	}
}
