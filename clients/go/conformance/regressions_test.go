package conformance_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	lockd "lockd.dev/client"
	"lockd.dev/client/fence"
)

// bedValue is a string of the testbed's description (server name, key).
func bedValue(t *testing.T, name, key string) string {
	t.Helper()
	if bedErr != nil {
		t.Fatal(bedErr)
	}
	var s map[string]any
	if err := json.Unmarshal(bed.servers[name], &s); err != nil {
		t.Fatalf("the testbed's %s: %v", name, err)
	}
	v, ok := s[key].(string)
	if !ok {
		t.Fatalf("the testbed's %s has no %s", name, key)
	}
	return v
}

func dialBed(t *testing.T) *lockd.Client {
	t.Helper()
	c, err := lockd.Dial([]string{bedValue(t, "lockd", "endpoint")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()) }

func acquire(t *testing.T, ctx context.Context, c *lockd.Client, resource string) *lockd.Lock {
	t.Helper()
	l, err := c.Acquire(ctx, resource, lockd.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatalf("acquire %s: %v", resource, err)
	}
	t.Cleanup(func() { _, _ = l.Release(context.Background()) })
	return l
}

func readValue(t *testing.T, ctx context.Context, conn *pgx.Conn, key string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(ctx, "SELECT v FROM conformance WHERE k = $1", key).Scan(&v); err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	return v
}

// staleLock is a lock of a resource whose newer holder has written key through fence-proxy
// (value "new"): its token is stale.
func staleLock(t *testing.T, ctx context.Context, c *lockd.Client, dsn, resource, key string) *lockd.Lock {
	t.Helper()
	old := acquire(t, ctx, c, resource)
	if _, err := c.Release(ctx, old.Resource(), old.Lease().LeaseID); err != nil {
		t.Fatal(err)
	}
	newer := acquire(t, ctx, c, resource)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := fence.Tx(ctx, conn, newer, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, upsert, key, "new")
		return err
	}); err != nil {
		t.Fatalf("the newer holder's write: %v", err)
	}
	return old
}

// The tester's repro: a fence.Tx inside another made a savepoint whose declaration outlived
// it, so the outer transaction (a stale token) was judged with the inner, current lock and
// its write committed. The inner one must be refused and the outer write must not land.
func TestNestedFenceTxDoesNotLetAStaleWriteThrough(t *testing.T) {
	ctx := context.Background()
	dsn := bedValue(t, "pg", "dsn")
	c := dialBed(t)
	key := uniq("nested")
	old := staleLock(t, ctx, c, dsn, uniq("nested-old"), key)
	other := acquire(t, ctx, c, uniq("nested-other"))

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var innerErr error
	err = fence.Tx(ctx, conn, old, func(tx pgx.Tx) error {
		innerErr = fence.Tx(ctx, tx, other, func(inner pgx.Tx) error { return nil })
		_, err := tx.Exec(ctx, "UPDATE conformance SET v = 'stale' WHERE k = $1", key)
		return err
	})
	if err == nil {
		t.Fatalf("the outer transaction with a stale token committed (inner fence.Tx: %v)", innerErr)
	}
	if !errors.Is(innerErr, lockd.ErrInvalidArgument) || !strings.Contains(innerErr.Error(), "own transaction") {
		t.Errorf("inner fence.Tx in a transaction: %v, want ErrInvalidArgument", innerErr)
	}
	if !errors.Is(err, lockd.ErrStaleToken) {
		t.Errorf("outer write: %v, want ErrStaleToken", err)
	}
	if v := readValue(t, ctx, conn, key); v != "new" {
		t.Fatalf("the stale write landed: %q", v)
	}
	// BeginTx on a transaction is refused too.
	err = fence.Tx(ctx, conn, other, func(tx pgx.Tx) error {
		_, err := fence.BeginTx(ctx, tx, other)
		return err
	})
	if !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Errorf("BeginTx on a transaction: %v", err)
	}
}

// A connection inside a transaction the caller opened by hand (Exec("BEGIN")): the helper must
// refuse, not join and commit the caller's work.
func TestFenceTxRefusesAConnectionInsideATransaction(t *testing.T) {
	ctx := context.Background()
	dsn := bedValue(t, "pg", "dsn")
	c := dialBed(t)
	key := uniq("open-tx")
	lock := acquire(t, ctx, c, uniq("open-tx"))
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO conformance VALUES ($1, 'caller')", key); err != nil {
		t.Fatal(err)
	}
	err = fence.Tx(ctx, conn, lock, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, upsert, key+"-helper", "helper")
		return err
	})
	if !errors.Is(err, lockd.ErrInvalidArgument) || !strings.Contains(err.Error(), "own transaction") {
		t.Errorf("fence.Tx on a connection inside a transaction: %v, want ErrInvalidArgument", err)
	}
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM conformance WHERE k IN ($1, $2)", key, key+"-helper").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("after the caller's ROLLBACK, %d rows were committed", n)
	}

	// database/sql: a *sql.Conn of pgx's driver inside a transaction.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sconn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close()
	if _, err := sconn.ExecContext(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := sconn.ExecContext(ctx, "INSERT INTO conformance VALUES ($1, 'caller')", key); err != nil {
		t.Fatal(err)
	}
	err = fence.SQLTx(ctx, sconn, lock, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, upsert, key+"-helper", "helper")
		return err
	})
	if !errors.Is(err, lockd.ErrInvalidArgument) || !strings.Contains(err.Error(), "own transaction") {
		t.Errorf("fence.SQLTx on a *sql.Conn inside a transaction: %v, want ErrInvalidArgument", err)
	}
	if _, err := sconn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM conformance WHERE k IN ($1, $2)", key, key+"-helper").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("database/sql: after the caller's ROLLBACK, %d rows were committed", n)
	}
	// Outside a transaction the same *sql.Conn and pgx connection are fine.
	if err := fence.SQLTx(ctx, sconn, lock, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, upsert, key, "sql")
		return err
	}); err != nil {
		t.Fatalf("fence.SQLTx on an idle *sql.Conn: %v", err)
	}
	if err := fence.Tx(ctx, conn, lock, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, upsert, key, "pgx")
		return err
	}); err != nil {
		t.Fatalf("fence.Tx on an idle connection: %v", err)
	}
}

// A waiting acquire cancelled just as lockd grants it must not leave a lease nobody holds
// (without the clean-up, it stays held for its TTL, 30 s).
func TestCancelledWaitLeavesNoLease(t *testing.T) {
	ctx := context.Background()
	a, b := dialBed(t), dialBed(t)
	const rounds = 30
	resources := make([]string, rounds)
	base := uniq("cancel-race")
	for i := range resources {
		resources[i] = fmt.Sprintf("%s-%d", base, i)
		r := resources[i]
		held, err := a.Acquire(ctx, r, lockd.AcquireOptions{TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		bctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			l, err := b.Acquire(bctx, r, lockd.AcquireOptions{TTL: 30 * time.Second, Wait: 60 * time.Second})
			if err == nil {
				_, _ = l.Release(ctx) // granted before the cancellation: not the case tested
			}
			done <- err
		}()
		waitFor(t, func() bool {
			d, err := a.Describe(ctx, r)
			return err == nil && d.Waiters == 1
		}, 10*time.Second, "round %d: B to wait", i)
		var start, both sync.WaitGroup
		start.Add(1)
		both.Add(2)
		go func() { defer both.Done(); start.Wait(); _, _ = held.Release(ctx) }()
		go func() { defer both.Done(); start.Wait(); cancel() }()
		start.Done()
		both.Wait()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: B's acquire: %v", i, err)
		}
	}
	// Every resource must become free well before the 30 s TTL.
	deadline := time.Now().Add(10 * time.Second)
	var stillHeld []string
	for {
		stillHeld = stillHeld[:0]
		for _, r := range resources {
			d, err := a.Describe(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			if d.Held {
				stillHeld = append(stillHeld, r)
			}
		}
		if len(stillHeld) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling interval, not synchronisation
	}
	if len(stillHeld) > 0 {
		t.Fatalf("%d of %d resources still held by an abandoned grant: %v", len(stillHeld), rounds, stillHeld)
	}
}

func waitFor(t *testing.T, cond func() bool, limit time.Duration, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for "+format, args...)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
	}
}

// A downgrade that fails (of an exclusive lock) ends the Lock and says so: its lease is
// released, so a caller that went on writing under it would write with a stale token.
func TestAFailedDowngradeSignalsTheLoss(t *testing.T) {
	ctx := context.Background()
	c := dialBed(t)
	r := uniq("downgrade-fails")
	l, err := c.Acquire(ctx, r, lockd.AcquireOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Downgrade(ctx); err == nil {
		t.Fatal("an exclusive lock was downgraded")
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("the Lock whose downgrade failed is not lost")
	}
	if !errors.Is(l.Err(), lockd.ErrLockLost) || l.Reason() != lockd.NotCurrent {
		t.Fatalf("Err %v, Reason %v: not lost as not current", l.Err(), l.Reason())
	}
	if d, err := c.Describe(ctx, r); err != nil || d.Held {
		t.Fatalf("%s after the failed downgrade: %+v, %v", r, d, err)
	}
}

// A downgrade given up after lockd made it (its answer lost, its retry held back by the test
// bed until a later call is answered) leaves no reader lease behind: the clean-up asks again
// under the same request id and releases the reader.
func TestAGivenUpDowngradeLeavesNoReader(t *testing.T) {
	ctx := context.Background()
	a := dialBed(t)
	l, err := lockd.Dial([]string{bedValue(t, "lossy", "endpoint")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	r := uniq("downgrade-given-up")
	w, err := l.Acquire(ctx, r, lockd.AcquireOptions{TTL: 30 * time.Second, Mode: lockd.Write})
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"cut-renewals off", "hold-next-call 1", "drop-next-answer"} {
		if _, err := bed.command(cmd); err != nil {
			t.Fatal(err)
		}
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := w.Downgrade(dctx)
		done <- err
	}()
	for _, cmd := range []string{"wait-cuts 1", "wait-held"} {
		if _, err := bed.command(cmd); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the given-up downgrade: %v", err)
	}
	if _, err := bed.command("wait-held-answered"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		d, err := a.Describe(ctx, r)
		return err == nil && !d.Held && d.Readers == 0
	}, 10*time.Second, "%s to be free of its reader", r)
}
