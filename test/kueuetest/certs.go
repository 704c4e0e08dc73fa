package kueuetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// metricsCertDir is where Kueue v0.17 reads its metrics certificate when internal certificate
// management is off (cmd/kueue/main.go); it cannot be configured.
const metricsCertDir = "/etc/kueue/metrics/certs"

// WriteServingCert makes a CA and a serving certificate for 127.0.0.1 and localhost signed by
// it, writes the certificate and key as tls.crt and tls.key into dir (where controller-runtime's
// webhook server reads them: Kueue's, and any other manager's), and returns the CA certificate
// for the webhook configurations' caBundle. Both are valid for a day.
func WriteServingCert(dir string) ([]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating webhook CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kueuetest webhook CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("generating webhook CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("generating webhook CA: %w", err)
	}
	certPEM, keyPEM, err := leafCert(now, ca, caKey, 24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("generating webhook serving certificate: %w", err)
	}
	if err := writePair(dir, certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("writing webhook serving certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

// ensureMetricsCert makes sure a valid certificate and key are in metricsCertDir, without which
// Kueue does not start. A pair already there, from an earlier run or a test process running at the
// same time, is kept. A new pair is written into a fresh directory that is then renamed into
// place, so that two processes never mix one's certificate with the other's key.
func ensureMetricsCert() error {
	if validPair(metricsCertDir) {
		return nil
	}
	parent := filepath.Dir(metricsCertDir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("kueue v0.17 needs a metrics certificate in %s (internal certificate management is off): %w", metricsCertDir, err)
	}
	tmp, err := os.MkdirTemp(parent, ".certs-")
	if err != nil {
		return fmt.Errorf("writing kueue's metrics certificate: %w", err)
	}
	certPEM, keyPEM, err := leafCert(time.Now(), nil, nil, 10*365*24*time.Hour)
	if err == nil {
		err = writePair(tmp, certPEM, keyPEM)
	}
	if err == nil {
		err = os.Rename(tmp, metricsCertDir)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		// Another process may have won the rename with a pair of its own.
		if validPair(metricsCertDir) {
			return nil
		}
		return fmt.Errorf("writing kueue's metrics certificate into %s: %w", metricsCertDir, err)
	}
	return nil
}

func validPair(dir string) bool {
	_, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	return err == nil
}

// leafCert makes a serving certificate for 127.0.0.1 and localhost, signed by ca, or self-signed
// when ca is nil.
func leafCert(now time.Time, ca *x509.Certificate, caKey *ecdsa.PrivateKey, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: loopback},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP(loopback)},
		DNSNames:     []string{"localhost"},
	}
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca, caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func writePair(dir string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return errors.Join(
		os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o644),
		os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600),
	)
}

// serial is a random certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still make a usable
		// certificate.
		return big.NewInt(1)
	}
	return n
}
