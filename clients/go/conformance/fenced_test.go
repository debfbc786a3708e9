package conformance_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	lockd "lockd.dev/client"
	"lockd.dev/client/fence"
)

const (
	upsert   = "INSERT INTO conformance VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
	settings = "SELECT coalesce(current_setting('fencing.resource', true), ''), " +
		"coalesce(current_setting('fencing.token', true), ''), pg_backend_pid()"
)

var errBoom = errors.New("boom")

func (r *run) fenced(step map[string]any) error {
	ctx := r.ctx
	dsn, err := r.server("pg", "dsn")
	if err != nil && str(step, "op") != "http_write" {
		return err
	}
	switch str(step, "op") {
	case "pg_write":
		lock := r.leases[str(step, "lease")].first()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		err = fence.Tx(ctx, conn, lock, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, upsert, r.s(step["key"]), r.s(step["value"]))
			return err
		})
		got := "ok"
		if errors.Is(err, lockd.ErrStaleToken) {
			got = "stale"
		} else if err != nil {
			return fmt.Errorf("pg_write with %s: %w", str(step, "lease"), err)
		}
		if want := str(step, "expect"); got != want {
			return fmt.Errorf("pg_write with %s: %s, expected %s", str(step, "lease"), got, want)
		}
	case "pg_read":
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var v string
		if err := conn.QueryRow(ctx, "SELECT v FROM conformance WHERE k = $1", r.s(step["key"])).Scan(&v); err != nil {
			return err
		}
		if want := r.s(step["value"]); v != want {
			return fmt.Errorf("read %q, expected %q", v, want)
		}
	case "http_write":
		lock := r.leases[str(step, "lease")].first()
		base, err := r.server("http", "url")
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+r.s(step["path"]), strings.NewReader("{}"))
		if err != nil {
			return err
		}
		got := "ok"
		resp, err := fence.Client(lock).Do(req)
		switch {
		case errors.Is(err, lockd.ErrStaleToken):
			got = "stale"
		case err != nil:
			return err
		default:
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				return fmt.Errorf("http_write with %s: HTTP %d", str(step, "lease"), resp.StatusCode)
			}
		}
		if want := str(step, "expect"); got != want {
			return fmt.Errorf("http_write with %s: %s, expected %s", str(step, "lease"), got, want)
		}
	case "pg_pool_check":
		return checkPools(ctx, dsn, r.leases[str(step, "lease")].first(), r.s(step["key"]))
	}
	return nil
}

func clean(resource, token string, pid, want int64, driver string) error {
	if resource != "" || token != "" {
		return fmt.Errorf("%s: the next user sees resource %q and token %q", driver, resource, token)
	}
	if pid != want {
		return fmt.Errorf("%s: not the same pooled connection (%d != %d)", driver, pid, want)
	}
	return nil
}

// checkPools: with pgx (a pool of one connection) and database/sql (pgx's driver, one open
// connection), a fenced transaction and one that fails leave nothing on the connection for
// its next user.
func checkPools(ctx context.Context, dsn string, lock *lockd.Lock, key string) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns, cfg.MinConns = 1, 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	var pid int64
	if err := fence.Tx(ctx, pool, lock, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, upsert, key, "pgx"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	}); err != nil {
		return fmt.Errorf("pgx: %w", err)
	}
	var res, tok string
	var got int64
	if err := pool.QueryRow(ctx, settings).Scan(&res, &tok, &got); err != nil {
		return err
	}
	if err := clean(res, tok, got, pid, "pgx pool"); err != nil {
		return err
	}
	err = fence.Tx(ctx, pool, lock, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, upsert, key, "pgx-failed"); err != nil {
			return err
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		return fmt.Errorf("pgx: the failed transaction returned %v", err)
	}
	if err := pool.QueryRow(ctx, settings).Scan(&res, &tok, &got); err != nil {
		return err
	}
	if err := clean(res, tok, got, pid, "pgx pool after a rollback"); err != nil {
		return err
	}

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if err := fence.SQLTx(ctx, db, lock, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, upsert, key, "database/sql"); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	}); err != nil {
		return fmt.Errorf("database/sql: %w", err)
	}
	if err := db.QueryRowContext(ctx, settings).Scan(&res, &tok, &got); err != nil {
		return err
	}
	if err := clean(res, tok, got, pid, "database/sql"); err != nil {
		return err
	}
	err = fence.SQLTx(ctx, db, lock, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, upsert, key, "database/sql-failed"); err != nil {
			return err
		}
		return errBoom
	})
	if !errors.Is(err, errBoom) {
		return fmt.Errorf("database/sql: the failed transaction returned %v", err)
	}
	if err := db.QueryRowContext(ctx, settings).Scan(&res, &tok, &got); err != nil {
		return err
	}
	return clean(res, tok, got, pid, "database/sql after a rollback")
}
