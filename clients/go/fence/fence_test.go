package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	lockd "lockd.dev/client"
)

func TestErrMapsSQLStates(t *testing.T) {
	for code, want := range map[string]error{"FN001": lockd.ErrStaleToken, "FN003": lockd.ErrStaleToken, "FN002": lockd.ErrFenceRefused, "FN004": lockd.ErrFenceRefused} {
		err := Err(fmt.Errorf("exec: %w", &pgconn.PgError{Code: code, Message: "refused"}))
		var fe *lockd.FenceError
		if !errors.Is(err, want) || !errors.As(err, &fe) || fe.Code != code {
			t.Errorf("%s: %v", code, err)
		}
		if want == lockd.ErrFenceRefused && errors.Is(err, lockd.ErrStaleToken) {
			t.Errorf("%s is not stale", code)
		}
		var pg *pgconn.PgError
		if !errors.As(err, &pg) {
			t.Errorf("%s: the driver's error is not kept", code)
		}
	}
	other := &pgconn.PgError{Code: "23505"}
	if Err(other) != error(other) || Err(nil) != nil {
		t.Error("other errors are changed")
	}
}

func TestTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Fencing-Resource") != "inv/sku-1" {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		problem := func(status int, kind string) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"type":"urn:fencing:problem:%s","title":"t","status":%d,"detail":"d","resource":"inv/sku-1","token":"7.k.mac","highest":9}`, kind, status)
		}
		switch r.Header.Get("Fencing-Token") {
		case "stale":
			problem(http.StatusConflict, "stale-token")
		case "forged":
			problem(http.StatusForbidden, "forged-token")
		case "gone":
			problem(http.StatusServiceUnavailable, "older-requests-in-flight")
		case "app":
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			io.WriteString(w, `{"type":"https://example.com/conflict"}`)
		default:
			io.WriteString(w, "fine")
		}
	}))
	defer srv.Close()
	do := func(token string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/x", strings.NewReader("{}"))
		return Client(Static("inv/sku-1", token)).Do(req)
	}
	resp, err := do("7.k.mac")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("ok: %v %v", resp, err)
	}
	resp.Body.Close()
	_, err = do("stale")
	var fe *lockd.FenceError
	if !errors.Is(err, lockd.ErrStaleToken) || !errors.As(err, &fe) || fe.Status != 409 || fe.Highest != 9 || fe.Token != "7.k.mac" {
		t.Fatalf("stale: %v %+v", err, fe)
	}
	if _, err = do("forged"); !errors.Is(err, lockd.ErrFenceRefused) || errors.Is(err, lockd.ErrStaleToken) {
		t.Fatalf("forged: %v", err)
	}
	for _, token := range []string{"gone", "app"} {
		resp, err := do(token)
		if err != nil {
			t.Fatalf("%s: %v", token, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if token == "app" && !strings.Contains(string(body), "example.com") {
			t.Fatalf("app: the body was not kept: %q", body)
		}
	}
}

// A redirect to another origin must not carry the token (a write capability); one to the same
// origin keeps it.
func TestTransportRedirectKeepsTokenToItsOrigin(t *testing.T) {
	type seen struct{ resource, token string }
	got := make(chan seen, 4)
	record := func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Header.Get("Fencing-Resource"), r.Header.Get("Fencing-Token")}
		io.WriteString(w, "fine")
	}
	// other records what it sees; its /back sends the request back to the first origin.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/back" {
			got <- seen{r.Header.Get("Fencing-Resource"), r.Header.Get("Fencing-Token")}
			http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusTemporaryRedirect)
			return
		}
		record(w, r)
	}))
	defer other.Close()
	self := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/target", http.StatusTemporaryRedirect)
		case "/here":
			http.Redirect(w, r, "/target", http.StatusTemporaryRedirect)
		case "/away-and-back":
			back := url.Values{"to": {"http://" + r.Host + "/target"}}
			http.Redirect(w, r, other.URL+"/back?"+back.Encode(), http.StatusTemporaryRedirect)
		default:
			record(w, r)
		}
	}))
	defer self.Close()
	lock := Static("inv/sku-1", "7.k.mac")
	do := func(path string, presetHeaders bool) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, self.URL+path, strings.NewReader("{}"))
		if presetHeaders {
			Headers(req.Header, lock) // set by the caller too: removed all the same
		}
		resp, err := Client(lock).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		resp.Body.Close()
	}
	fenced := seen{"inv/sku-1", "7.k.mac"}
	do("/here", false)
	if s := <-got; s != fenced {
		t.Fatalf("same-origin redirect: the headers were not kept: %+v", s)
	}
	for _, preset := range []bool{false, true} {
		do("/away", preset)
		if s := <-got; s != (seen{}) {
			t.Fatalf("redirect to another origin (headers preset %v): it saw %+v", preset, s)
		}
	}
	do("/away-and-back", false)
	for i := 0; i < 2; i++ {
		if s := <-got; s != (seen{}) {
			t.Fatalf("redirect away and back, hop %d: it saw %+v", i+1, s)
		}
	}
}

// txLike is a database/sql beginner that is itself a transaction (it has Commit).
type txLike struct{ began *bool }

func (t txLike) BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error) {
	*t.began = true
	return nil, errors.New("began")
}
func (t txLike) Commit() error { return nil }

func TestSQLTxRefusesATransactionLikeBeginner(t *testing.T) {
	began := false
	err := SQLTx(context.Background(), txLike{&began}, Static("r", "1"), func(*sql.Tx) error { return nil })
	if !errors.Is(err, lockd.ErrInvalidArgument) || !strings.Contains(err.Error(), "own transaction") || began {
		t.Fatalf("SQLTx on a transaction-like beginner: %v (began: %v)", err, began)
	}
}
