package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the paths of the files the control plane is started with. They are generated on a state
// directory's first start and reused on every restart (as a real control plane keeps its CA and keys), so
// clients keep trusting the API server and service-account tokens stay valid; nothing is rotated. CAKey signs
// the admin client certificate of the Talos-shaped kubeconfig (admincert.go); it is not in files(): a state
// directory an earlier simkube wrote without it still resumes, only without that kubeconfig.
type pki struct {
	CACert, CAKey, ServingCert, ServingKey, SAPublic, SAPrivate string
}

// pkiPaths is where the files of the PKI in dir are.
func pkiPaths(dir string) pki {
	return pki{
		CACert: filepath.Join(dir, "ca.crt"), CAKey: filepath.Join(dir, "ca.key"), ServingCert: filepath.Join(dir, "apiserver.crt"),
		ServingKey: filepath.Join(dir, "apiserver.key"), SAPublic: filepath.Join(dir, "sa.pub"),
		SAPrivate: filepath.Join(dir, "sa.key"),
	}
}

// files lists every file of the PKI.
func (p pki) files() []string {
	return []string{p.CACert, p.ServingCert, p.ServingKey, p.SAPublic, p.SAPrivate}
}

// writePKI creates a self-signed CA, a serving certificate for 127.0.0.1/localhost signed by it, and the
// service-account signing key pair. Keys are written 0600 in a 0700 directory.
func writePKI(dir string) (pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return pki{}, err
	}

	p := pkiPaths(dir)

	caKey, caCert, err := newCA()
	if err != nil {
		return pki{}, err
	}

	servingKey, servingDER, err := newServingCert(caKey, caCert)
	if err != nil {
		return pki{}, err
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return pki{}, err
	}

	saPublic, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return pki{}, err
	}

	files := []struct {
		path, kind string
		der        []byte
	}{
		{p.CACert, "CERTIFICATE", caCert.Raw},
		{p.ServingCert, "CERTIFICATE", servingDER},
		{p.SAPublic, "PUBLIC KEY", saPublic},
		{p.SAPrivate, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)},
	}

	for _, k := range []struct {
		path string
		key  *ecdsa.PrivateKey
	}{{p.ServingKey, servingKey}, {p.CAKey, caKey}} {
		der, err := x509.MarshalECPrivateKey(k.key)
		if err != nil {
			return pki{}, err
		}

		files = append(files, struct {
			path, kind string
			der        []byte
		}{k.path, "EC PRIVATE KEY", der})
	}

	for _, f := range files {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			return pki{}, err
		}
	}

	return p, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120)) //nolint:errcheck // crypto/rand does not fail on Linux

	return n
}

func newCA() (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}

	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "simkube-ca", Organization: []string{"talos-gpu-runbooks rehearsal"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}

	cert, err := x509.ParseCertificate(der)

	return key, cert, err
}

func newServingCert(caKey crypto.Signer, ca *x509.Certificate) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}

	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)

	return key, der, err
}

// newToken returns a random bearer token; it is written only to 0600 files, never printed.
func newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("token: %w", err)
	}

	return hex.EncodeToString(b), nil
}
