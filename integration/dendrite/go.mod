module github.com/mtxdb/mtxdb/integration/dendrite

go 1.26.0

require (
	github.com/mtxdb/mtxdb v0.0.0
	github.com/mtxdb/mtxdb/hamtstore v0.0.0
	github.com/mtxdb/mtxdb/packstore v0.0.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mtxdb/mtxdb/internal v0.0.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.23.0 // indirect
)

require (
	github.com/MFAshby/stdemuxerhook v1.0.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgraph-io/ristretto/v2 v2.4.2 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/edsrzf/mmap-go v1.2.0 // indirect
	github.com/getsentry/sentry-go v0.14.0 // indirect
	github.com/hashicorp/go-set/v3 v3.0.0 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/kr/pretty v0.3.1 // indirect
	github.com/matrix-org/dendrite v0.13.8
	github.com/matrix-org/dugong v0.0.0-20210921133753-66e6b1c67e2e // indirect
	github.com/matrix-org/gomatrix v0.0.0-20220926102614-ceba4d9f7530 // indirect
	github.com/matrix-org/gomatrixserverlib v0.0.0-20250815065806-6697d93cbcba
	github.com/matrix-org/util v0.0.0-20221111132719-399730281e66 // indirect
	github.com/minio/highwayhash v1.0.3 // indirect
	github.com/mtxdb/mtxdb/pgstore v0.0.0
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/nats-io/jwt/v2 v2.5.8 // indirect
	github.com/nats-io/nats-server/v2 v2.10.20 // indirect
	github.com/nats-io/nats.go v1.36.0 // indirect
	github.com/nats-io/nkeys v0.4.7 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/oleiade/lane/v2 v2.0.0 // indirect
	github.com/opentracing/opentracing-go v1.2.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/sirupsen/logrus v1.9.3 // indirect
	github.com/tidwall/gjson v1.18.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	github.com/uber/jaeger-client-go v2.30.0+incompatible // indirect
	github.com/uber/jaeger-lib v2.4.1+incompatible // indirect
	go.uber.org/atomic v1.11.0 // indirect
	golang.org/x/crypto v0.38.0 // indirect
	golang.org/x/exp v0.0.0-20240506185415-9bf2ced13842 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.6.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
)

replace github.com/mtxdb/mtxdb => ../..

replace github.com/mtxdb/mtxdb/internal => ../../internal

replace github.com/mtxdb/mtxdb/packstore => ../../packstore

replace github.com/mtxdb/mtxdb/hamtstore => ../../hamtstore

replace github.com/mtxdb/mtxdb/pgstore => ../../pgstore
