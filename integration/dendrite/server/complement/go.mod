module github.com/mtxdb/mtxdb/integration/dendrite/server/complement

go 1.26.0

// github.com/matrix-org/complement is not required here: the module proxy does not
// serve it. run.sh unpacks a Complement snapshot under .build/complement and writes a
// go.work there that uses both that copy and this module; build and test this module
// through it (GOWORK=.build/complement/go.work), not on its own.
