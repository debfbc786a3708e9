// Package fence puts a lock's fencing token on every write, in one line, and turns
// fence-proxy's refusals into *lockd.FenceError (errors.Is lockd.ErrStaleToken or
// lockd.ErrFenceRefused).
//
// PostgreSQL through fence-proxy: the resource and token are declared for one transaction
// with set_config(..., true), so a pooled connection never carries them to its next user.
// The helpers open their own transaction: given a transaction, or a connection inside one,
// they refuse (lockd.ErrInvalidArgument).
//
//	err := fence.Tx(ctx, pool, lock, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, "UPDATE ..."); return err })
//	err := fence.SQLTx(ctx, db, lock, func(tx *sql.Tx) error { ... })  // database/sql, pgx's stdlib driver
//
// HTTP through fence-proxy (Fencing-Resource and Fencing-Token on every request):
//
//	client := &http.Client{Transport: fence.Transport(lock, nil)}
package fence

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	lockd "lockd.dev/client"
)

// Fenced is what a write is fenced with: a *lockd.Lock (or Static).
type Fenced interface {
	Resource() string
	FenceToken() string
}

// Static is a Fenced of a resource and a fence token known otherwise (e.g. the Resource and
// FenceToken() of a lockd.Lease handed over by Lock.Detach).
func Static(resource, fenceToken string) Fenced { return static{resource, fenceToken} }

type static struct{ resource, token string }

func (s static) Resource() string   { return s.resource }
func (s static) FenceToken() string { return s.token }

// Declare is the statement that declares a lock's resource ($1) and token ($2) for the
// current transaction only.
const Declare = "SELECT set_config('fencing.resource', $1, true), set_config('fencing.token', $2, true)"

// Err turns a driver's error carrying a fence refusal (SQLSTATE FN00x, as a *pgconn.PgError,
// which pgx and its database/sql driver both return) into a *lockd.FenceError wrapping it:
// FN001 and FN003 are stale tokens, the others refusals. Other errors (and nil) are returned
// as they are.
func Err(err error) error {
	if err == nil {
		return nil
	}
	var fe *lockd.FenceError
	if errors.As(err, &fe) {
		return err
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && strings.HasPrefix(pg.Code, "FN") {
		return &lockd.FenceError{
			Stale: pg.Code == "FN001" || pg.Code == "FN003", Code: pg.Code,
			Message: strings.TrimSpace(pg.Message), Err: err,
		}
	}
	return err
}

// TxBeginner is what a pgx transaction begins on: *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn,
// outside any transaction. A pgx.Tx is refused (its Begin is a savepoint, and a declaration
// made in a savepoint outlives RELEASE SAVEPOINT: the outer transaction would be judged with
// this lock's resource and token), and so is a connection whose server session is inside a
// transaction (e.g. after Exec("BEGIN")): the helpers open and end their own transaction,
// never join or commit the caller's.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

func inTransaction(op string) error {
	return &lockd.Error{Kind: lockd.ErrInvalidArgument, Op: op,
		Message: "the helper opens its own transaction and cannot run inside one: " +
			"give it a pool or a connection outside any transaction, not a transaction (nested fencing would judge the outer transaction with this lock)"}
}

// idle says whether a pgx connection's server session is outside any transaction
// (ReadyForQuery status 'I').
func idle(pc *pgconn.PgConn) bool { return pc == nil || pc.TxStatus() == 'I' }

// checkBeginner refuses a transaction, or a connection inside one.
func checkBeginner(op string, db any) error {
	switch d := db.(type) {
	case pgx.Tx:
		return inTransaction(op)
	case interface{ PgConn() *pgconn.PgConn }: // *pgx.Conn
		if !idle(d.PgConn()) {
			return inTransaction(op)
		}
	case interface{ Conn() *pgx.Conn }: // *pgxpool.Conn
		if c := d.Conn(); c != nil && !idle(c.PgConn()) {
			return inTransaction(op)
		}
	}
	return nil
}

// BeginTx begins a pgx transaction and declares lock's resource and token in it. The pgx.Tx
// it returns gives fence refusals from Exec, Query, QueryRow(...).Scan and Commit as
// *lockd.FenceError (wrap others, e.g. Rows.Err or SendBatch results, with Err). Commit or
// roll it back as usual.
func BeginTx(ctx context.Context, db TxBeginner, lock Fenced) (pgx.Tx, error) {
	if err := checkBeginner("fence.BeginTx", db); err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, Err(err)
	}
	if _, err := tx.Exec(ctx, Declare, lock.Resource(), lock.FenceToken()); err != nil {
		_ = tx.Rollback(ctx)
		return nil, Err(err)
	}
	return fencedTx{tx}, nil
}

// Tx runs fn in a pgx transaction in which lock's resource and token are declared: commits
// when fn returns nil, rolls back otherwise. A fence refusal (from fn's statements or the
// commit) is returned as *lockd.FenceError.
func Tx(ctx context.Context, db TxBeginner, lock Fenced, fn func(tx pgx.Tx) error) error {
	tx, err := BeginTx(ctx, db, lock)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		return Err(err)
	}
	return Err(tx.Commit(ctx))
}

type fencedTx struct{ pgx.Tx }

func (t fencedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.Tx.Exec(ctx, sql, args...)
	return tag, Err(err)
}

func (t fencedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.Tx.Query(ctx, sql, args...)
	return rows, Err(err)
}

func (t fencedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return fencedRow{t.Tx.QueryRow(ctx, sql, args...)}
}

func (t fencedTx) Commit(ctx context.Context) error { return Err(t.Tx.Commit(ctx)) }

func (t fencedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	inner, err := t.Tx.Begin(ctx)
	if err != nil {
		return nil, Err(err)
	}
	return fencedTx{inner}, nil
}

type fencedRow struct{ pgx.Row }

func (r fencedRow) Scan(dest ...any) error { return Err(r.Row.Scan(dest...)) }

// SQLBeginner is what a database/sql transaction begins on: *sql.DB or *sql.Conn (with pgx's
// driver, github.com/jackc/pgx/v5/stdlib), outside any transaction. A beginner that is itself
// a transaction (it has Commit) is refused; so is a *sql.Conn of pgx's driver whose session is
// inside a transaction (e.g. after ExecContext("BEGIN")). With another driver the status of
// a *sql.Conn cannot be seen: do not pass one inside a transaction. A *sql.DB is safe with
// pgx's driver: it discards a pooled connection left inside a transaction.
type SQLBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// errNotIdle ends sql.Conn.Raw when the driver's connection is pgx's and inside a transaction.
var errNotIdle = errors.New("not idle")

// checkSQLBeginner refuses a transaction-like beginner, or a pgx connection inside a
// transaction.
func checkSQLBeginner(op string, db any) error {
	if _, ok := db.(interface{ Commit() error }); ok {
		return inTransaction(op)
	}
	raw, ok := db.(interface {
		Raw(func(driverConn any) error) error
	})
	if !ok {
		return nil
	}
	err := raw.Raw(func(driverConn any) error {
		if err := checkBeginner(op, driverConn); err != nil {
			return errNotIdle
		}
		return nil
	})
	if errors.Is(err, errNotIdle) {
		return inTransaction(op)
	}
	return nil // any other failure shows itself at BeginTx
}

// BeginSQLTx begins a database/sql transaction and declares lock's resource and token in it.
// Wrap the errors of its statements and of Commit with Err to see fence refusals as
// *lockd.FenceError (SQLTx does).
func BeginSQLTx(ctx context.Context, db SQLBeginner, lock Fenced, opts *sql.TxOptions) (*sql.Tx, error) {
	if err := checkSQLBeginner("fence.BeginSQLTx", db); err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return nil, Err(err)
	}
	if _, err := tx.ExecContext(ctx, Declare, lock.Resource(), lock.FenceToken()); err != nil {
		_ = tx.Rollback()
		return nil, Err(err)
	}
	return tx, nil
}

// SQLTx runs fn in a database/sql transaction in which lock's resource and token are
// declared: commits when fn returns nil, rolls back otherwise. A fence refusal is returned as
// *lockd.FenceError.
func SQLTx(ctx context.Context, db SQLBeginner, lock Fenced, fn func(tx *sql.Tx) error) error {
	tx, err := BeginSQLTx(ctx, db, lock, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return Err(err)
	}
	return Err(tx.Commit())
}

// Headers sets the two headers fence-proxy reads.
func Headers(h http.Header, lock Fenced) {
	h.Set("Fencing-Resource", lock.Resource())
	h.Set("Fencing-Token", lock.FenceToken())
}

type transport struct {
	lock Fenced
	base http.RoundTripper
}

// Transport wraps base (nil: http.DefaultTransport) to add lock's Fencing-Resource and
// Fencing-Token to every request (a redirect to another origin, scheme, host and port, gets
// neither: they are removed if present, and any later redirect of its chain too), and to return fence-proxy's refusals of the token as a
// *lockd.FenceError: 409 stale-token as lockd.ErrStaleToken; 403 forged-token or
// unsigned-token, 400 malformed-token or malformed-resource, 428 fencing-required as
// lockd.ErrFenceRefused. Any other response is returned as it is.
func Transport(lock Fenced, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{lock: lock, base: base}
}

// Client is an *http.Client whose requests are fenced with lock (see Transport).
func Client(lock Fenced) *http.Client { return &http.Client{Transport: Transport(lock, nil)} }

var refusals = map[string]bool{
	"stale-token": true, "forged-token": true, "unsigned-token": true, "malformed-token": true,
	"malformed-resource": true, "fencing-required": true,
}

// origin is a URL's scheme, host and port (the default port when none is given).
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// redirectedAway says whether req is a redirect (made by http.Client) of a request of another
// origin: some request of its chain had an origin other than req's.
func redirectedAway(req *http.Request) bool {
	o := origin(req.URL)
	for r := req; r.Response != nil && r.Response.Request != nil; {
		r = r.Response.Request
		if origin(r.URL) != o {
			return true
		}
	}
	return false
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if redirectedAway(req) {
		// The token is a write capability: never handed to a host a redirect points at.
		r.Header.Del("Fencing-Resource")
		r.Header.Del("Fencing-Token")
		return t.base.RoundTrip(r)
	}
	Headers(r.Header, t.lock)
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if refusal := CheckResponse(resp); refusal != nil {
		return nil, refusal
	}
	return resp, nil
}

const problemMax = 64 << 10

// CheckResponse returns a *lockd.FenceError when resp is fence-proxy's refusal of the token
// (consuming and closing its body), else nil (leaving the body readable).
func CheckResponse(resp *http.Response) error {
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusForbidden, http.StatusBadRequest, http.StatusPreconditionRequired:
	default:
		return nil
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/problem+json" {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, problemMax))
	if err != nil {
		return nil
	}
	var problem struct {
		Type     string          `json:"type"`
		Detail   string          `json:"detail"`
		Resource string          `json:"resource"`
		Token    json.RawMessage `json:"token"`
		Highest  uint64          `json:"highest"`
	}
	name := ""
	if json.Unmarshal(body, &problem) == nil && strings.HasPrefix(problem.Type, "urn:fencing:problem:") {
		name = strings.TrimPrefix(problem.Type, "urn:fencing:problem:")
	}
	if !refusals[name] {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
		return nil
	}
	resp.Body.Close()
	token := strings.Trim(string(problem.Token), `"`)
	return &lockd.FenceError{
		Stale: resp.StatusCode == http.StatusConflict && name == "stale-token", Code: name, Status: resp.StatusCode,
		Resource: problem.Resource, Token: token, Highest: problem.Highest, Message: problem.Detail,
	}
}
