module github.com/mtxdb/mtxdb/integration/dendrite/roomrules

go 1.26.0

require (
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/matrix-org/gomatrixserverlib v0.0.0-20250815065806-6697d93cbcba
	github.com/mtxdb/mtxdb v0.0.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgraph-io/ristretto/v2 v2.4.2 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/edsrzf/mmap-go v1.2.0 // indirect
	github.com/hashicorp/go-set/v3 v3.0.0 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/matrix-org/util v0.0.0-20221111132719-399730281e66 // indirect
	github.com/mtxdb/mtxdb/hamtstore v0.0.0 // indirect
	github.com/mtxdb/mtxdb/internal v0.0.0 // indirect
	github.com/mtxdb/mtxdb/packstore v0.0.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/oleiade/lane/v2 v2.0.0 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/tidwall/gjson v1.18.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	golang.org/x/crypto v0.38.0 // indirect
	golang.org/x/exp v0.0.0-20231108232855-2478ac86f678 // indirect
	golang.org/x/sys v0.48.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/mtxdb/mtxdb => ../../..

replace github.com/mtxdb/mtxdb/internal => ../../../internal

replace github.com/mtxdb/mtxdb/packstore => ../../../packstore

replace github.com/mtxdb/mtxdb/hamtstore => ../../../hamtstore

replace github.com/mtxdb/mtxdb/pgstore => ../../../pgstore
