module github.com/mtxdb/mtxdb/hamtstore

go 1.26.0

require github.com/mtxdb/mtxdb/internal v0.0.0

replace github.com/mtxdb/mtxdb/internal => ../internal
