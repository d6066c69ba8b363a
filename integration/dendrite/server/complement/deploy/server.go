package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/matrix-org/gomatrixserverlib/spec"
)

// server is one Dendrite process on 127.0.0.1 and the directory it runs in: its
// signing key, TLS certificate, configuration, SQLite databases (and, on the
// patched build, mtxdb's store beside them) and server.log. Its two ports are fixed
// for its lifetime, because its server name, stored in its databases, names the
// federation port. Its methods are safe for concurrent use.
type server struct {
	alias    string          // hs1, hs2, ...: the name tests pass to the Deployment
	name     spec.ServerName // 127.0.0.1:FEDPORT, the Matrix server name
	dir      string
	bin      string   // directory of dendrite, generate-config, generate-keys
	env      []string // Dendrite's environment
	httpPort int      // client-server API, plain HTTP
	fedPort  int      // federation API, HTTPS with a certificate of Complement's CA
	timeout  time.Duration
	probe    *http.Client // trusts Complement's CA

	mu     sync.Mutex // guards cmd, exited, paused
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
	paused bool
}

// baseURL is the client-server API's address.
func (s *server) baseURL() string { return fmt.Sprintf("http://127.0.0.1:%d", s.httpPort) }

// fedURL is the federation API's address.
func (s *server) fedURL() string { return fmt.Sprintf("https://127.0.0.1:%d", s.fedPort) }

// logLevel is the level Dendrite logs at: generate-config -ci writes trace, which
// under Complement writes megabytes per test; $MTXDB_COMPLEMENT_LOG_LEVEL changes it.
func logLevel() string {
	if l := os.Getenv("MTXDB_COMPLEMENT_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}

var traceLevel = regexp.MustCompile(`(?m)^(\s+)level: trace$`)

// prepare writes the server's directory: a signing key (generate-keys), a TLS
// certificate for 127.0.0.1 signed by the run's CA, and dendrite.yaml from
// generate-config -ci (SQLite files in the directory, registration open with the
// shared secret Complement uses, rate limits off, no key perspectives, TLS checked
// on outgoing federation) with the server name 127.0.0.1:FEDPORT.
func (s *server) prepare(ca *authority) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	if _, err := s.run("generate-keys", "-private-key", "matrix_key.pem"); err != nil {
		return err
	}
	if err := ca.writeServerCert(filepath.Join(s.dir, "server.crt"), filepath.Join(s.dir, "server.key")); err != nil {
		return err
	}
	cfg, err := s.run("generate-config", "-ci", "-dir", s.dir, "-server", string(s.name))
	if err != nil {
		return err
	}
	if !traceLevel.MatchString(cfg) {
		return fmt.Errorf("generate-config -ci wrote no 'level: trace' line to change")
	}
	cfg = traceLevel.ReplaceAllString(cfg, "${1}level: "+logLevel())
	return os.WriteFile(filepath.Join(s.dir, "dendrite.yaml"), []byte(cfg), 0o600)
}

func (s *server) run(tool string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(s.bin, tool), args...)
	cmd.Dir = s.dir
	cmd.Env = s.env
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), nil
}

// start runs Dendrite and waits until both APIs answer: /versions on the client
// port and /_matrix/key/v2/server over TLS on the federation port. A process that
// exits first, or does not answer within the timeout, is an error carrying the end
// of its log.
func (s *server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("%s (%s) is already running", s.alias, s.name)
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "=== %s: starting %s as %s (client API %s, federation %s)\n",
		time.Now().Format(time.RFC3339Nano), filepath.Join(s.bin, "dendrite"), s.name, s.baseURL(), s.fedURL())
	cmd := exec.Command(filepath.Join(s.bin, "dendrite"), "-config", "dendrite.yaml", "-really-enable-open-registration",
		"-http-bind-address", fmt.Sprintf("127.0.0.1:%d", s.httpPort),
		"-https-bind-address", fmt.Sprintf("127.0.0.1:%d", s.fedPort),
		"-tls-cert", "server.crt", "-tls-key", "server.key")
	cmd.Dir = s.dir
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server dies with the test binary, whatever ends it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	s.cmd, s.exited, s.paused = cmd, exited, false
	track(s)

	deadline := time.Now().Add(s.timeout)
	for {
		select {
		case <-exited:
			s.cmd = nil
			untrack(s)
			return fmt.Errorf("%s (%s) exited during start-up (%v); end of %s:\n%s",
				s.alias, s.name, cmd.ProcessState, filepath.Join(s.dir, "server.log"), s.logTail(40))
		case <-time.After(100 * time.Millisecond):
		}
		if s.answers() {
			return nil
		}
		if time.Now().After(deadline) {
			s.stopLocked()
			return fmt.Errorf("%s (%s) did not answer within %s; end of %s:\n%s",
				s.alias, s.name, s.timeout, filepath.Join(s.dir, "server.log"), s.logTail(40))
		}
	}
}

func (s *server) answers() bool {
	for _, u := range []string{s.baseURL() + "/_matrix/client/versions", s.fedURL() + "/_matrix/key/v2/server"} {
		resp, err := s.probe.Get(u)
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
	}
	return true
}

// stop ends the process: SIGTERM (and SIGCONT, should it be paused), then SIGKILL
// after five seconds. A stopped server can be started again.
func (s *server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *server) stopLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd, s.paused = nil, false
	untrack(s)
}

// signal sends SIGSTOP (pause) or SIGCONT (unpause) to the running process.
func (s *server) signal(pause bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("%s (%s) is not running", s.alias, s.name)
	}
	if s.paused == pause {
		return fmt.Errorf("%s (%s): paused is already %v", s.alias, s.name, pause)
	}
	sig := syscall.SIGCONT
	if pause {
		sig = syscall.SIGSTOP
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return err
	}
	s.paused = pause
	return nil
}

// logTail returns the last n lines of server.log.
func (s *server) logTail(n int) string {
	f, err := os.Open(filepath.Join(s.dir, "server.log"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// The servers running in this process, for Cleanup.
var running struct {
	sync.Mutex
	set map[*server]bool
}

func track(s *server) {
	running.Lock()
	defer running.Unlock()
	if running.set == nil {
		running.set = map[*server]bool{}
	}
	running.set[s] = true
}

func untrack(s *server) {
	running.Lock()
	defer running.Unlock()
	delete(running.set, s)
}

func stopAll() {
	running.Lock()
	var all []*server
	for s := range running.set {
		all = append(all, s)
	}
	running.Unlock()
	for _, s := range all {
		s.stop()
	}
}

// Ports handed out in this process, never twice. They are taken below the kernel's
// ephemeral range, so that neither outgoing connections nor the :0 listeners of
// Complement's own servers can take one between its check here and Dendrite's bind.
var ports struct {
	sync.Mutex
	used map[int]bool
}

const lowestPort = 10000

func freePort() (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.used == nil {
		ports.used = map[int]bool{}
	}
	high := ephemeralLow()
	if high <= lowestPort+100 {
		return 0, fmt.Errorf("the ephemeral port range starts at %d: no room below it above %d", high, lowestPort)
	}
	for range 1000 {
		p := lowestPort + rand.IntN(high-lowestPort)
		if ports.used[p] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		ports.used[p] = true
		return p, nil
	}
	return 0, errors.New("no free port on 127.0.0.1 found in 1000 tries")
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 when it
// cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 32768
}

// probeClient is an HTTP client that trusts only the run's CA, as Dendrite does.
func probeClient(ca *authority) *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: ca.transport()}
}
