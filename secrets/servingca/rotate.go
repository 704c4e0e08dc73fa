package servingca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// keyPair is a certificate with its private key.
type keyPair struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// state is what the Secret holds: the trusted CAs, newest first, and the serving
// certificate.
type state struct {
	cas     []keyPair
	serving *keyPair
}

// policy is how long things live, taken from Options.
type policy struct {
	hosts        []string
	caValidity   time.Duration
	certValidity time.Duration
	overlap      time.Duration
}

// backdate is how far before its creation a certificate is valid, so that a client
// whose clock is a little behind accepts it.
const backdate = time.Hour

// created is when a certificate was made.
func created(c *x509.Certificate) time.Time { return c.NotBefore.Add(backdate) }

// rotate brings st up to date at now, reporting whether anything changed.
func rotate(st state, now time.Time, p policy) (state, bool, error) {
	changed := false
	// Expired CAs verify nothing any more.
	live := slices.DeleteFunc(slices.Clone(st.cas), func(ca keyPair) bool { return !now.Before(ca.cert.NotAfter) })
	if len(live) != len(st.cas) {
		changed = true
	}
	if len(live) == 0 || remaining(live[0].cert, now) < p.caValidity/3 {
		ca, err := newCA(now, p.caValidity)
		if err != nil {
			return st, false, err
		}
		live = append([]keyPair{ca}, live...)
		changed = true
	}
	signer := signing(live, now, p.overlap)
	srv := st.serving
	if srv == nil || !validFor(srv.cert, signer.cert, now, p) {
		kp, err := newServing(signer, now, p)
		if err != nil {
			return st, false, err
		}
		srv = &kp
		changed = true
	}
	return state{cas: live, serving: srv}, changed, nil
}

// signing is the CA that signs the serving certificate: the newest one that has been
// trusted for the overlap, or the oldest when none has been yet.
func signing(cas []keyPair, now time.Time, overlap time.Duration) keyPair {
	for _, ca := range cas {
		if !now.Before(created(ca.cert).Add(overlap)) {
			return ca
		}
	}
	return cas[len(cas)-1]
}

func remaining(c *x509.Certificate, now time.Time) time.Duration { return c.NotAfter.Sub(now) }

// validFor reports whether the serving certificate may stay: signed by signer, for the
// wanted names, with more than a third of its life left.
func validFor(c, signer *x509.Certificate, now time.Time, p policy) bool {
	if c.CheckSignatureFrom(signer) != nil {
		return false
	}
	if remaining(c, now) < p.certValidity/3 {
		return false
	}
	return slices.Equal(names(c), slices.Sorted(slices.Values(p.hosts)))
}

// names are the DNS names and IP addresses of a certificate, sorted.
func names(c *x509.Certificate) []string {
	out := slices.Clone(c.DNSNames)
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	slices.Sort(out)
	return out
}

func newCA(now time.Time, validity time.Duration) (keyPair, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "flotilla-hub-proxy-ca@" + now.UTC().Format("2006-01-02T15:04:05Z")},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return issue(tmpl, nil)
}

func newServing(ca keyPair, now time.Time, p policy) (keyPair, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "flotilla-hub-proxy"},
		NotBefore:   now.Add(-backdate),
		NotAfter:    now.Add(p.certValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	// A certificate outliving its CA would fail before its rotation is due.
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	for _, h := range p.hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return issue(tmpl, &ca)
}

// issue makes a key and a certificate of tmpl for it, signed by parent, or by itself
// when parent is nil.
func issue(tmpl *x509.Certificate, parent *keyPair) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("generating a key for %s: %w", tmpl.Subject.CommonName, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return keyPair{}, fmt.Errorf("drawing a serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	signerCert, signerKey := tmpl, crypto.Signer(key)
	if parent != nil {
		signerCert, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signerCert, key.Public(), signerKey)
	if err != nil {
		return keyPair{}, fmt.Errorf("signing %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{cert: cert, key: key}, nil
}

// Keys of the Secret.
const (
	keyCACerts   = "ca.crt"
	keyCAKeys    = "ca.key"
	keyTLSCert   = "tls.crt"
	keyTLSKey    = "tls.key"
	pemCert      = "CERTIFICATE"
	pemECDSAKey  = "EC PRIVATE KEY"
	errCorrupted = "the CA Secret is corrupted"
)

// encode is the Secret's data for st.
func encode(st state) (map[string][]byte, error) {
	var certs, keys bytes.Buffer
	for _, ca := range st.cas {
		if err := writePair(&certs, &keys, ca); err != nil {
			return nil, err
		}
	}
	var tc, tk bytes.Buffer
	if err := writePair(&tc, &tk, *st.serving); err != nil {
		return nil, err
	}
	return map[string][]byte{keyCACerts: certs.Bytes(), keyCAKeys: keys.Bytes(), keyTLSCert: tc.Bytes(), keyTLSKey: tk.Bytes()}, nil
}

func writePair(certs, keys *bytes.Buffer, kp keyPair) error {
	ek, ok := kp.key.(*ecdsa.PrivateKey)
	if !ok {
		return fmt.Errorf("a key of type %T", kp.key)
	}
	der, err := x509.MarshalECPrivateKey(ek)
	if err != nil {
		return err
	}
	_ = pem.Encode(certs, &pem.Block{Type: pemCert, Bytes: kp.cert.Raw})
	_ = pem.Encode(keys, &pem.Block{Type: pemECDSAKey, Bytes: der})
	return nil
}

// decode reads st from the Secret's data. Data that does not parse is an error, not an
// empty state: a new CA would cut off every client that trusts the old one, so an
// operator decides (by deleting the Secret).
func decode(data map[string][]byte) (state, error) {
	var st state
	if len(data) == 0 {
		return st, nil
	}
	certs, err := readPEM(data[keyCACerts], pemCert)
	if err != nil {
		return st, err
	}
	keys, err := readPEM(data[keyCAKeys], pemECDSAKey)
	if err != nil {
		return st, err
	}
	if len(certs) == 0 || len(certs) != len(keys) {
		return st, fmt.Errorf("%s: %d CA certificates and %d keys", errCorrupted, len(certs), len(keys))
	}
	for i := range certs {
		kp, err := pair(certs[i], keys[i])
		if err != nil {
			return st, err
		}
		st.cas = append(st.cas, kp)
	}
	tc, err := readPEM(data[keyTLSCert], pemCert)
	if err != nil {
		return st, err
	}
	tk, err := readPEM(data[keyTLSKey], pemECDSAKey)
	if err != nil {
		return st, err
	}
	if len(tc) == 1 && len(tk) == 1 {
		kp, err := pair(tc[0], tk[0])
		if err != nil {
			return st, err
		}
		st.serving = &kp
	}
	return st, nil
}

func readPEM(data []byte, typ string) ([][]byte, error) {
	var out [][]byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != typ {
			return nil, fmt.Errorf("%s: a PEM block of type %q where %q belongs", errCorrupted, b.Type, typ)
		}
		out = append(out, b.Bytes)
	}
	return out, nil
}

func pair(certDER, keyDER []byte) (keyPair, error) {
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return keyPair{}, fmt.Errorf("%s: %w", errCorrupted, err)
	}
	key, err := x509.ParseECPrivateKey(keyDER)
	if err != nil {
		return keyPair{}, fmt.Errorf("%s: %w", errCorrupted, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return keyPair{}, errors.New(errCorrupted + ": a key does not match its certificate")
	}
	return keyPair{cert: cert, key: key}, nil
}
