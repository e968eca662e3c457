package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// The admin kubeconfig with the structure Talos generates, which a simulated control-plane node hands out.
// Why: talosctl 1.14's upgrade --drain fetches the admin kubeconfig from the node and refuses any other structure
// than Talos's (one cluster with certificate-authority-data, one user with a client certificate and key and
// nothing else, one context in namespace default): siderolabs/talos@v1.14.1 pkg/kubeconfig/validate.go:29-176,
// called by cmd/talosctl/pkg/talos/kubeclient/kubeclient.go:30 for the drain. simkube's token kubeconfig fails
// that ('user field "token" is not allowed'), so the drain of every 1.14 node stopped there.
// What Talos puts in it: kubeconfig.GenerateAdmin (pkg/kubeconfig/generate.go:35-124 at v1.14.1), a client
// certificate signed by the cluster's Kubernetes CA with CN "admin" and O "system:masters"
// (pkg/machinery/constants: KubernetesAdminCertCommonName, KubernetesAdminCertOrganization), valid from 10 s
// before now for a year (KubernetesAdminCertDefaultLifetime), key usages digital signature and key encipherment,
// extended usage client auth. Talos makes a new certificate on every request; simkube makes one on every start.

// talosKubeconfigName is the file, in the state directory, of that kubeconfig (its server: the API server's).
const talosKubeconfigName = "admin-cert.kubeconfig"

// adminCertLifetime is Talos's default admin certificate lifetime (constants.KubernetesAdminCertDefaultLifetime).
const adminCertLifetime = 365 * 24 * time.Hour

// errNoCAKey is why a state directory an earlier simkube wrote has no Talos-shaped kubeconfig: it kept no CA key.
var errNoCAKey = errors.New("the state directory was written by a simkube that kept no CA key")

// writeTalosKubeconfig writes <state>/admin-cert.kubeconfig (0600) with a fresh admin client certificate and
// returns its path; errNoCAKey (wrapped, naming the key's path) when the PKI has no CA key.
func writeTalosKubeconfig(state, server, clusterName string, p pki) (string, error) {
	caKey, caCert, err := readCA(p)
	if err != nil {
		return "", err
	}

	certPEM, keyPEM, err := adminCert(caKey, caCert)
	if err != nil {
		return "", err
	}

	path := filepath.Join(state, talosKubeconfigName)

	return path, writeJSON(path, talosKubeconfig(server, clusterName, caCert.Raw, certPEM, keyPEM))
}

// readCA reads the CA certificate and its key from the PKI.
func readCA(p pki) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	keyPEM, err := os.ReadFile(p.CAKey)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("%w (no %s)", errNoCAKey, p.CAKey)
	} else if err != nil {
		return nil, nil, err
	}

	certPEM, err := os.ReadFile(p.CACert)
	if err != nil {
		return nil, nil, err
	}

	keyBlock, _ := pem.Decode(keyPEM)
	certBlock, _ := pem.Decode(certPEM)

	if keyBlock == nil || certBlock == nil {
		return nil, nil, fmt.Errorf("%s or %s is not PEM", p.CAKey, p.CACert)
	}

	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", p.CAKey, err)
	}

	cert, err := x509.ParseCertificate(certBlock.Bytes)

	return key, cert, err
}

// adminCert issues the admin client certificate as Talos's kubeconfig.Generate does; PEM certificate and key.
func adminCert(caKey *ecdsa.PrivateKey, ca *x509.Certificate) ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}

	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		NotBefore:    time.Now().Add(-10 * time.Second),
		NotAfter:     time.Now().Add(adminCertLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}

	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
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

// talosKubeconfig is generate.go:102-124's structure: cluster <name>, user and context admin@<name>, namespace
// default, everything embedded (encoding/json writes []byte as base64, as a kubeconfig's *-data fields are).
func talosKubeconfig(server, name string, caDER, certPEM, keyPEM []byte) map[string]any {
	user := "admin@" + name

	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Config",
		"clusters": []any{map[string]any{"name": name, "cluster": map[string]any{
			"server": server, "certificate-authority-data": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		}}},
		"users": []any{map[string]any{"name": user, "user": map[string]any{
			"client-certificate-data": certPEM, "client-key-data": keyPEM,
		}}},
		"contexts":        []any{map[string]any{"name": user, "context": map[string]any{"cluster": name, "namespace": "default", "user": user}}},
		"current-context": user,
	}
}
