// Package deploy is a Complement deployer that starts Dendrite v0.13.8 processes
// on 127.0.0.1 instead of Docker containers, for running Complement
// (github.com/matrix-org/complement) against the stock and the mtxdb-patched
// builds of make dendrite. A test package's TestMain passes New to
// complement.WithDeployment and Cleanup to complement.WithCleanup
// (main_test.go.in in this module, which run.sh writes into the unpacked tests).
//
// Each server hsN of a deployment has a directory of its own under
// $MTXDB_COMPLEMENT_WORK: a signing key from generate-keys, a TLS certificate for
// 127.0.0.1 signed by the CA Complement generates for the run, dendrite.yaml from
// generate-config -ci with the server name 127.0.0.1:FEDPORT and SQLite databases
// in the directory, and server.log. Dendrite trusts that CA alone (SSL_CERT_FILE),
// so federation with the other servers and with Complement's own servers
// (COMPLEMENT_HOSTNAME_RUNNING_COMPLEMENT=127.0.0.1) is checked TLS on loopback.
// Server names are real addresses. Only the Deployment's RoundTripper maps an
// alias to its server (a request to https://hs1/...); a test that writes the
// literal name "hs1" into a user ID, an alias or a destination does not reach it.
package deploy
