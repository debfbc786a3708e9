// Command bench is the Go half of bench/sdk.sh: N holders, each acquiring and releasing its own
// resource as fast as answers come for a while, through the Go SDK or through redislock (the
// lock a Go team would otherwise pick) against Redis; one JSON line of acquire+release pairs/s.
//
//	go run . -target lockd -endpoint http://127.0.0.1:17420 -clients 64 -seconds 10
//	go run . -target redislock -endpoint 127.0.0.1:16379 -clients 64 -seconds 10
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	lockd "lockd.dev/client"
)

func main() {
	target := flag.String("target", "lockd", "lockd or redislock")
	endpoint := flag.String("endpoint", "", "lockd's URL, or Redis's host:port")
	clients := flag.Int("clients", 64, "concurrent holders")
	seconds := flag.Float64("seconds", 10, "how long")
	flag.Parse()
	ctx := context.Background()
	run := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().Unix())
	var pair func(i int) error
	var name string
	switch *target {
	case "lockd":
		c, err := lockd.Dial([]string{*endpoint})
		if err != nil {
			panic(err)
		}
		name = "go sdk"
		pair = func(i int) error {
			l, err := c.Acquire(ctx, fmt.Sprintf("gobench-%s-%d", run, i), lockd.AcquireOptions{TTL: 30 * time.Second})
			if err != nil {
				return err
			}
			_, err = l.Release(ctx)
			return err
		}
	case "redislock":
		rdb := redis.NewClient(&redis.Options{Addr: *endpoint, PoolSize: *clients})
		locker := redislock.New(rdb)
		name = "redislock (go-redis)"
		pair = func(i int) error {
			l, err := locker.Obtain(ctx, fmt.Sprintf("gobench-%s-%d", run, i), 30*time.Second, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	default:
		panic("unknown target " + *target)
	}
	var pairs, errors atomic.Int64
	stop := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
	began := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := pair(i); err != nil {
					errors.Add(1)
					continue
				}
				pairs.Add(1)
			}
		}(i)
	}
	wg.Wait()
	took := time.Since(began).Seconds()
	out, _ := json.Marshal(map[string]any{"sdk": name, "clients": *clients, "pairs": pairs.Load(),
		"errors": errors.Load(), "seconds": took, "pairs_per_s": float64(pairs.Load()) / took})
	fmt.Println(string(out))
}
