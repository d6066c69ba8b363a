module github.com/mtxdb/mtxdb/hamtstore

go 1.26.0
