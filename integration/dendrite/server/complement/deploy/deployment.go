package deploy

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/matrix-org/complement"
	"github.com/matrix-org/complement/client"
	"github.com/matrix-org/complement/config"
	"github.com/matrix-org/complement/ct"
	"github.com/matrix-org/complement/helpers"
	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Environment variables the deployer reads.
const (
	// EnvBin names the directory holding dendrite, generate-config and
	// generate-keys (bin or bin/stock of make dendrite). Required.
	EnvBin = "MTXDB_COMPLEMENT_BIN"
	// EnvWork names the directory under which each deployment gets a directory
	// of its own (default: $TMPDIR/mtxdb-complement).
	EnvWork = "MTXDB_COMPLEMENT_WORK"
	// EnvKeep, set to 1, keeps the directories of passing tests too; a failed
	// test's directory is always kept.
	EnvKeep = "MTXDB_COMPLEMENT_KEEP"
)

// Deployment is n Dendrite processes started for one test: hs1 ... hsN, each
// with its own directory, server name 127.0.0.1:FEDPORT and client API on
// http://127.0.0.1:PORT. It implements complement.Deployment for tests that call
// complement.Deploy(t, n); application services, blueprints (OldDeploy) and
// Docker networks are not supported. Its methods are safe for concurrent use.
type Deployment struct {
	cfg       *config.Complement
	dir       string
	aliases   []string           // hs1, hs2, ...
	servers   map[string]*server // by alias; not changed after New
	transport http.RoundTripper
	localpart atomic.Int64 // numbers the users Register makes
	destroyed atomic.Bool
}

var _ complement.Deployment = (*Deployment)(nil)

// New starts numServers Dendrite processes; pass it to complement.WithDeployment.
// It fails the test when a server does not start. The deployment is destroyed by
// Destroy or, for a *testing.T, at the test's cleanup, whichever comes first.
func New(t ct.TestLike, numServers int, cfg *config.Complement) complement.Deployment {
	t.Helper()
	d, err := deploy(t.Name(), numServers, cfg)
	if err != nil {
		ct.Fatalf(t, "mtxdb deployer: %s", err)
		return nil
	}
	if c, ok := t.(interface{ Cleanup(func()) }); ok {
		c.Cleanup(func() { d.Destroy(t) })
	}
	return d
}

// Cleanup stops every server still running; pass it to complement.WithCleanup.
func Cleanup(*config.Complement) { stopAll() }

// The CA file of each test package's run (one config.Complement, one CA).
var authorities struct {
	sync.Mutex
	byConfig map[*config.Complement]*authority
}

func authorityFor(cfg *config.Complement, work string) (*authority, error) {
	authorities.Lock()
	defer authorities.Unlock()
	if a := authorities.byConfig[cfg]; a != nil {
		return a, nil
	}
	f, err := os.CreateTemp(work, "complement-ca-*.crt")
	if err != nil {
		return nil, err
	}
	f.Close()
	a, err := newAuthority(cfg, f.Name())
	if err != nil {
		return nil, err
	}
	if authorities.byConfig == nil {
		authorities.byConfig = map[*config.Complement]*authority{}
	}
	authorities.byConfig[cfg] = a
	return a, nil
}

var deployments atomic.Int64

func deploy(testName string, n int, cfg *config.Complement) (*Deployment, error) {
	bin := os.Getenv(EnvBin)
	if bin == "" {
		return nil, fmt.Errorf("$%s is not set (the directory of dendrite, generate-config, generate-keys)", EnvBin)
	}
	work := os.Getenv(EnvWork)
	if work == "" {
		work = filepath.Join(os.TempDir(), "mtxdb-complement")
	}
	work = filepath.Join(work, cfg.PackageNamespace)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, err
	}
	ca, err := authorityFor(cfg, work)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(work, fmt.Sprintf("%s-%d", strings.NewReplacer("/", "_", " ", "_").Replace(testName), deployments.Add(1)))
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	d := &Deployment{
		cfg:       cfg,
		dir:       dir,
		servers:   map[string]*server{},
		transport: ca.transport(),
	}
	env := serverEnv(cfg, ca.caFile)
	for i := 1; i <= n; i++ {
		alias := fmt.Sprintf("hs%d", i)
		httpPort, err := freePort()
		if err != nil {
			return nil, err
		}
		fedPort, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &server{
			alias:    alias,
			name:     spec.ServerName(fmt.Sprintf("127.0.0.1:%d", fedPort)),
			dir:      filepath.Join(dir, alias),
			bin:      bin,
			env:      env,
			httpPort: httpPort,
			fedPort:  fedPort,
			timeout:  cfg.SpawnHSTimeout,
			probe:    probeClient(ca),
		}
		if err := s.prepare(ca); err != nil {
			return nil, fmt.Errorf("%s: %w", alias, err)
		}
		d.aliases = append(d.aliases, alias)
		d.servers[alias] = s
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, alias := range d.aliases {
		wg.Go(func() { errs[i] = d.servers[alias].start() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			d.stopAll()
			return nil, err
		}
	}
	return d, nil
}

// serverEnv is this process's environment for Dendrite, with SSL_CERT_FILE naming
// the CA alone, the variables of cfg's COMPLEMENT_SHARE_ENV_PREFIX passed without
// the prefix, and no mtxdb store location (each server keeps its store in its
// own directory).
func serverEnv(cfg *config.Complement, caFile string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "SSL_CERT_FILE" || k == "SSL_CERT_DIR" || strings.HasPrefix(k, "MTXDB_DENDRITE_STATE_"):
		case cfg.EnvVarsPropagatePrefix != "" && strings.HasPrefix(k, cfg.EnvVarsPropagatePrefix):
			env = append(env, strings.TrimPrefix(k, cfg.EnvVarsPropagatePrefix)+"="+v)
		default:
			env = append(env, kv)
		}
	}
	return append(env, "SSL_CERT_FILE="+caFile)
}

func (d *Deployment) server(t ct.TestLike, hsName, what string) *server {
	t.Helper()
	s := d.servers[hsName]
	if s == nil {
		ct.Fatalf(t, "Deployment.%s: no homeserver %q in this deployment (%s)", what, hsName, strings.Join(d.aliases, ", "))
	}
	return s
}

// GetFullyQualifiedHomeserverName returns hsName's server name, 127.0.0.1:FEDPORT.
func (d *Deployment) GetFullyQualifiedHomeserverName(t ct.TestLike, hsName string) spec.ServerName {
	t.Helper()
	return d.server(t, hsName, "GetFullyQualifiedHomeserverName").name
}

func (d *Deployment) newClient(t ct.TestLike, s *server, password string) *client.CSAPI {
	t.Helper()
	return client.NewCSAPI(client.CSAPIOpts{
		BaseURL:          s.baseURL(),
		Client:           client.NewLoggedClient(t, s.alias, nil),
		SyncUntilTimeout: 5 * time.Second,
		Debug:            d.cfg.DebugLoggingEnabled,
		Password:         password,
	})
}

// UnauthenticatedClient returns a client of hsName's client-server API without a user.
func (d *Deployment) UnauthenticatedClient(t ct.TestLike, hsName string) *client.CSAPI {
	t.Helper()
	return d.newClient(t, d.server(t, hsName, "UnauthenticatedClient"), "")
}

// defaultPassword is the password of users registered without one.
const defaultPassword = "complement_meets_min_password_req"

// Register registers user-N (and the suffix asked for) on hsName: through the
// shared-secret admin endpoint for an admin, /register otherwise.
func (d *Deployment) Register(t ct.TestLike, hsName string, opts helpers.RegistrationOpts) *client.CSAPI {
	t.Helper()
	password := opts.Password
	if password == "" {
		password = defaultPassword
	}
	c := d.newClient(t, d.server(t, hsName, "Register"), password)
	localpart := fmt.Sprintf("user-%d", d.localpart.Add(1))
	if opts.LocalpartSuffix != "" {
		localpart += "-" + opts.LocalpartSuffix
	}
	if opts.IsAdmin {
		c.UserID, c.AccessToken, c.DeviceID = c.RegisterSharedSecret(t, localpart, password, true)
	} else {
		c.UserID, c.AccessToken, c.DeviceID = c.RegisterUser(t, localpart, password)
	}
	return c
}

// Login logs in again, on hsName, as the user of an existing client (with its
// password unless opts names one).
func (d *Deployment) Login(t ct.TestLike, hsName string, existing *client.CSAPI, opts helpers.LoginOpts) *client.CSAPI {
	t.Helper()
	s := d.server(t, hsName, "Login")
	localpart, _, err := gomatrixserverlib.SplitID('@', existing.UserID)
	if err != nil {
		ct.Fatalf(t, "Deployment.Login: user ID %q of the existing client: %s", existing.UserID, err)
	}
	password := existing.Password
	if opts.Password != "" {
		password = opts.Password
	}
	c := d.newClient(t, s, password)
	var loginOpts []client.LoginOpt
	if opts.DeviceID != "" {
		loginOpts = append(loginOpts, client.WithDeviceID(opts.DeviceID))
	}
	c.UserID, c.AccessToken, c.DeviceID = c.LoginUser(t, localpart, password, loginOpts...)
	return c
}

// AppServiceUser fails the test: this deployer registers no application services.
func (d *Deployment) AppServiceUser(t ct.TestLike, hsName, appServiceUserID string) *client.CSAPI {
	t.Helper()
	ct.Fatalf(t, "Deployment.AppServiceUser(%s, %s): the mtxdb process deployer runs no application services", hsName, appServiceUserID)
	return nil
}

// Restart stops every server (SIGTERM) and starts it again on the same ports
// and directory.
func (d *Deployment) Restart(t ct.TestLike) error {
	t.Helper()
	for _, alias := range d.aliases {
		s := d.servers[alias]
		s.stop()
		if err := s.start(); err != nil {
			t.Errorf("Deployment.Restart: %s", err)
			return err
		}
	}
	return nil
}

// StopServer stops hsName's process (SIGTERM); StartServer starts it again.
func (d *Deployment) StopServer(t ct.TestLike, hsName string) {
	t.Helper()
	s := d.server(t, hsName, "StopServer")
	t.Logf("StopServer %s (%s)", hsName, s.name)
	s.stop()
}

// StartServer starts hsName's process again after StopServer.
func (d *Deployment) StartServer(t ct.TestLike, hsName string) {
	t.Helper()
	s := d.server(t, hsName, "StartServer")
	t.Logf("StartServer %s (%s)", hsName, s.name)
	if err := s.start(); err != nil {
		ct.Fatalf(t, "StartServer: %s", err)
	}
}

// PauseServer suspends hsName's process (SIGSTOP); its ports stay bound.
func (d *Deployment) PauseServer(t ct.TestLike, hsName string) {
	t.Helper()
	d.pause(t, hsName, "PauseServer", true)
}

// UnpauseServer resumes hsName's process (SIGCONT).
func (d *Deployment) UnpauseServer(t ct.TestLike, hsName string) {
	t.Helper()
	d.pause(t, hsName, "UnpauseServer", false)
}

func (d *Deployment) pause(t ct.TestLike, hsName, what string, pause bool) {
	t.Helper()
	s := d.server(t, hsName, what)
	t.Logf("%s %s (%s)", what, hsName, s.name)
	if err := s.signal(pause); err != nil {
		ct.Fatalf(t, "%s: %s", what, err)
	}
}

// ContainerID returns hsName's directory: there are no containers.
func (d *Deployment) ContainerID(t ct.TestLike, hsName string) string {
	t.Helper()
	return d.server(t, hsName, "ContainerID").dir
}

// Destroy stops every server. A failed test's directory is kept and named, with
// the end of each server's log; a passing test's is removed (unless
// $MTXDB_COMPLEMENT_KEEP=1). Later calls do nothing.
func (d *Deployment) Destroy(t ct.TestLike) {
	t.Helper()
	if d.destroyed.Swap(true) {
		return
	}
	d.stopAll()
	if t.Failed() || d.cfg.AlwaysPrintServerLogs {
		for _, alias := range d.aliases {
			s := d.servers[alias]
			t.Logf("%s (%s): end of %s:\n%s", alias, s.name, filepath.Join(s.dir, "server.log"), s.logTail(30))
		}
	}
	if t.Failed() || os.Getenv(EnvKeep) == "1" {
		t.Logf("mtxdb deployer: server directories kept in %s", d.dir)
		return
	}
	if err := os.RemoveAll(d.dir); err != nil {
		t.Logf("mtxdb deployer: %s", err)
	}
}

func (d *Deployment) stopAll() {
	var wg sync.WaitGroup
	for _, s := range d.servers {
		wg.Go(s.stop)
	}
	wg.Wait()
}

// GetConfig returns the test package's Complement configuration.
func (d *Deployment) GetConfig() *config.Complement { return d.cfg }

// RoundTripper sends Complement's federation requests (matrix-federation:// or
// https:// URLs) over HTTPS to the address their host names: a server name here
// is that address, 127.0.0.1:FEDPORT, and a host that is a server's alias (hs1,
// without a port) is that server's federation address. It trusts the run's CA only.
func (d *Deployment) RoundTripper() http.RoundTripper { return federationTripper{d} }

type federationTripper struct{ d *Deployment }

func (f federationTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.URL.Scheme = "https"
	if s := f.d.servers[r.URL.Host]; s != nil {
		r.URL.Host = fmt.Sprintf("127.0.0.1:%d", s.fedPort)
	}
	return f.d.transport.RoundTrip(r)
}

// Network returns "": the servers run on the host's loopback, in no Docker network.
func (d *Deployment) Network() string { return "" }
