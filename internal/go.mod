module github.com/mtxdb/mtxdb/internal

go 1.26.0

require (
	github.com/edsrzf/mmap-go v1.2.0
	golang.org/x/sys v0.48.0
)
