package main

import (
	"crypto/tls"
	stdx509 "crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/siderolabs/crypto/x509"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/role"
)

// contextName is the talosconfig context simnode writes.
const contextName = "simnode"

// pki is the Talos API PKI of the simulated cluster: the OS CA, apid's server certificate and the admin client.
type pki struct {
	serverTLS *tls.Config
}

// newPKI generates the PKI the way Talos does and writes <stateDir>/talosconfig for endpoint.
//
// CA: secrets.NewTalosCA (talos@v1.12.0:pkg/machinery/config/generate/secrets/ca.go:55), as `talosctl gen secrets`.
// Server certificate: x509.NewKeyPair with IP SANs and ServerAuth, as apid's certificate is made
// (talos@v1.12.0:internal/app/machined/pkg/controllers/secrets/api.go:287-296).
// Client certificate: secrets.NewAdminCertificateAndKey with role os:admin (ca.go:66), as `talosctl gen config`.
func newPKI(stateDir string, endpoint string) (*pki, error) {
	now := time.Now()

	ca, err := secrets.NewTalosCA(now)
	if err != nil {
		return nil, fmt.Errorf("generating the Talos CA: %w", err)
	}

	server, err := x509.NewKeyPair(ca,
		x509.IPAddresses([]net.IP{net.IPv4(127, 0, 0, 1)}),
		x509.CommonName("simnode"),
		x509.NotAfter(now.Add(x509.DefaultCertificateValidityDuration)),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
	)
	if err != nil {
		return nil, fmt.Errorf("generating the server certificate: %w", err)
	}

	caPEM := &x509.PEMEncodedCertificateAndKey{Crt: ca.CrtPEM, Key: ca.KeyPEM}

	admin, err := secrets.NewAdminCertificateAndKey(now, caPEM, role.MakeSet(role.Admin), 365*24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("generating the admin client certificate: %w", err)
	}

	cfg := clientconfig.NewConfig(contextName, []string{endpoint}, ca.CrtPEM, admin)
	if err = cfg.Save(filepath.Join(stateDir, "talosconfig")); err != nil {
		return nil, fmt.Errorf("writing the talosconfig: %w", err)
	}

	return newServerTLS(ca.CrtPEM, server)
}

func newServerTLS(caPEM []byte, server *x509.KeyPair) (*pki, error) {
	pool := stdx509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("the generated CA does not parse")
	}

	return &pki{serverTLS: &tls.Config{
		Certificates: []tls.Certificate{*server.Certificate},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}}, nil
}

// ensureStateDir creates the state directory owner-only (it holds the CA key and the admin key).
func ensureStateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("-state-dir %s: %w", dir, err)
	}

	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("-state-dir %s: %w", dir, err)
	}

	if info.Mode().Perm() != 0o700 {
		return fmt.Errorf("-state-dir %s: mode is %o, must be 0700 (it will hold the talosconfig with the admin key)", dir, info.Mode().Perm())
	}

	return nil
}
