module github.com/pglease/pglease/bench/peers

go 1.25

require (
	cirello.io/pglock v1.16.1
	github.com/bsm/redislock v0.10.0
	github.com/lib/pq v1.10.9
	github.com/redis/go-redis/v9 v9.19.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
)
