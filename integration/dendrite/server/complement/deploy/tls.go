package deploy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/matrix-org/complement/config"
)

// authority is the certificate authority Complement generates for each test
// package run (config.Complement's CACertificate and CAPrivateKey). Its
// certificate, written to caFile, is the only root the Dendrite processes trust
// (SSL_CERT_FILE): Complement's own federation servers present certificates it
// signed, and each Dendrite presents one signed here. Docker's deployer does the
// same with a mounted CA that each container adds to its system store.
type authority struct {
	cert   *x509.Certificate
	key    *rsa.PrivateKey
	pool   *x509.CertPool
	caFile string
}

func newAuthority(cfg *config.Complement, caFile string) (*authority, error) {
	pemBytes, err := cfg.CACertificateBytes()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(caFile, pemBytes, 0o644); err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cfg.CACertificate)
	return &authority{cert: cfg.CACertificate, key: cfg.CAPrivateKey, pool: pool, caFile: caFile}, nil
}

// transport is an HTTP transport that trusts only this CA.
func (a *authority) transport() *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: a.pool}}
}

// writeServerCert writes a certificate for 127.0.0.1 (and localhost), valid for a
// day, and its ECDSA P-256 key, both PEM.
func (a *authority) writeServerCert(certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
}
