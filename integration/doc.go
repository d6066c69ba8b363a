// Package integration holds end-to-end tests: the real rooms of testrooms/ imported
// into a packfile store, replayed through state resolution and checked against the
// state their origin servers recorded, before and after a repack and a reopen.
package integration
