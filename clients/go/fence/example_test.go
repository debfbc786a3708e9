package fence_test

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	lockd "lockd.dev/client"
	"lockd.dev/client/fence"
)

// The README's example (compiled, not run).
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://app@127.0.0.1:6432/app")
	client, err := lockd.Dial([]string{"http://127.0.0.1:7420"})
	if err != nil {
		return
	}
	lock, err := client.Acquire(ctx, "inventory:sku-1", lockd.AcquireOptions{TTL: 30 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		return // errors.Is(err, lockd.ErrWaitTimedOut): someone else has it
	}
	defer lock.Release(context.WithoutCancel(ctx))
	err = fence.Tx(ctx, pool, lock, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE stock SET n = n - 1 WHERE sku = 'sku-1'")
		return err
	})
	if errors.Is(err, lockd.ErrStaleToken) {
		return // a newer holder exists: stop
	}
}
