package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// testCA is a certificate authority made for one test run; every server's
// certificate (for 127.0.0.1 and localhost) is signed by it, and the servers trust it
// through SSL_CERT_FILE (Go's crypto/x509 reads the roots from that file on Linux),
// so federation TLS is verified, not skipped.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // PEM of the CA certificate
	pool *x509.CertPool
}

func newTestCA(t *testing.T, dir string) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "mtxdb partition test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, file: filepath.Join(dir, "ca.pem"), pool: x509.NewCertPool()}
	ca.pool.AddCert(cert)
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue writes a server certificate for 127.0.0.1 and localhost, signed by the CA,
// to certFile and its key to keyFile, and returns the pair.
func (ca *testCA) issue(t *testing.T, serial int64, certFile, keyFile string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// partitionProxy holds one TLS front per server: the server's federation name is
// 127.0.0.1:PORT of its front, and the front forwards every request to the server's
// own HTTPS listener, Host header kept. A request signed with an X-Matrix
// Authorization header names its sending server (origin=...); when that server is
// cut from the one behind the front, the front answers at once 502 with an
// M_UNKNOWN error and forwards nothing. Requests without X-Matrix (the key API,
// /_matrix/key/v2/server) always pass. A cut is symmetric: cutting A from B refuses
// A's requests to B and B's to A.
type partitionProxy struct {
	ca *testCA

	mu     sync.Mutex         // guards cut and counts
	cut    map[[2]string]bool // server-name pairs, both orders
	counts map[[3]string]int  // (origin, destination, "passed"|"refused") -> requests
	fronts []*http.Server     // one per server, closed by close
	labels map[string]string  // server name -> label (A, B, C) for the log
	listen map[string]net.Listener

	// observe, when set before the first serve, sees every request the proxy
	// forwards (origin "" when unsigned), called on the request's goroutine before
	// forwarding, at the time the front has read its headers; it may read r.Body if
	// it puts an equal body back.
	observe func(origin, dest string, r *http.Request)
}

func newPartitionProxy(ca *testCA) *partitionProxy {
	return &partitionProxy{ca: ca, cut: map[[2]string]bool{}, counts: map[[3]string]int{},
		labels: map[string]string{}, listen: map[string]net.Listener{}}
}

// reserve opens the listener of a new front and returns its server name
// (127.0.0.1:PORT); serve starts forwarding it once the server's port is known.
func (p *partitionProxy) reserve(t *testing.T, label string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	name := ln.Addr().String()
	p.mu.Lock()
	p.labels[name], p.listen[name] = label, ln
	p.mu.Unlock()
	return name
}

// serve forwards the front of server name to https://127.0.0.1:httpsPort, with cert
// as the front's certificate; the backend's certificate is checked against the CA.
func (p *partitionProxy) serve(name string, httpsPort int, cert tls.Certificate) {
	target, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", httpsPort))
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host
		},
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.ca.pool}, ResponseHeaderTimeout: 5 * time.Minute},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	srv := &http.Server{Handler: p.handler(name, rp), ErrorLog: log.New(io.Discard, "", 0),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	p.mu.Lock()
	ln := p.listen[name]
	p.fronts = append(p.fronts, srv)
	p.mu.Unlock()
	go func() { _ = srv.ServeTLS(ln, "", "") }()
}

var xMatrixOrigin = regexp.MustCompile(`origin="?([^",]+)"?`)

func (p *partitionProxy) handler(dest string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		origin := ""
		if strings.HasPrefix(auth, "X-Matrix ") {
			if m := xMatrixOrigin.FindStringSubmatch(auth); m != nil {
				origin = m[1]
			}
		}
		p.mu.Lock()
		refused := origin != "" && p.cut[[2]string{origin, dest}]
		verdict := "passed"
		if refused {
			verdict = "refused"
		}
		if origin != "" {
			p.counts[[3]string{origin, dest, verdict}]++
		}
		p.mu.Unlock()
		if refused {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, `{"errcode":"M_UNKNOWN","error":"test partition: the origin is cut from this server"}`)
			return
		}
		if p.observe != nil {
			p.observe(origin, dest, r)
		}
		next.ServeHTTP(w, r)
	})
}

// partition cuts every server of side a from every server of side b.
func (p *partitionProxy) partition(a, b []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			p.cut[[2]string{x, y}], p.cut[[2]string{y, x}] = true, true
		}
	}
}

// heal removes every cut.
func (p *partitionProxy) heal() {
	p.mu.Lock()
	p.cut = map[[2]string]bool{}
	p.mu.Unlock()
}

// takeCounts returns the federation requests seen since the last call, one
// "A->B passed=N refused=M" entry per pair, and resets the counters.
func (p *partitionProxy) takeCounts() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	pairs := map[string][2]int{}
	for k, n := range p.counts {
		pair := p.labels[k[0]] + "->" + p.labels[k[1]]
		c := pairs[pair]
		if k[2] == "refused" {
			c[1] += n
		} else {
			c[0] += n
		}
		pairs[pair] = c
	}
	p.counts = map[[3]string]int{}
	var out []string
	for pair, c := range pairs {
		out = append(out, fmt.Sprintf("%s passed=%d refused=%d", pair, c[0], c[1]))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func (p *partitionProxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.fronts {
		_ = s.Close()
	}
	for _, ln := range p.listen {
		_ = ln.Close()
	}
}
