package lockd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func tokenFile(t *testing.T, content string) string {
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDialRefusesUnsafeOrInconsistentSettings(t *testing.T) {
	tok := tokenFile(t, "s3cret\n")
	cases := []struct {
		name      string
		endpoints []string
		opts      []Option
		want      string
	}{
		{"bearer over plaintext to another host", []string{"http://lockd.example:7420"}, []Option{WithBearerTokenFile(tok)}, "plaintext"},
		{"bearer over plaintext, one endpoint remote", []string{"http://127.0.0.1:7420", "http://10.0.0.2:7420"}, []Option{WithBearerToken("x")}, "plaintext"},
		{"TLS files with http://", []string{"http://127.0.0.1:7420"}, []Option{WithCAFile("/nonexistent/ca.pem")}, "https://"},
		{"client cert with http://", []string{"http://127.0.0.1:7420"}, []Option{WithClientCert("c.pem", "k.pem")}, "https://"},
		{"mixed schemes", []string{"http://127.0.0.1:7420", "https://127.0.0.1:7421"}, nil, "mix"},
		{"cert without key", []string{"https://127.0.0.1:7420"}, []Option{WithClientCert("c.pem", "")}, "key"},
		{"token and token file", []string{"https://127.0.0.1:7420"}, []Option{WithBearerToken("x"), WithBearerTokenFile(tok)}, "not both"},
		{"token with a space", []string{"https://127.0.0.1:7420"}, []Option{WithBearerToken("a b")}, "printable"},
		{"missing token file", []string{"https://127.0.0.1:7420"}, []Option{WithBearerTokenFile("/nonexistent/token")}, "cannot read"},
		{"missing CA file", []string{"https://127.0.0.1:7420"}, []Option{WithCAFile("/nonexistent/ca.pem")}, "cannot read"},
		{"no scheme", []string{"127.0.0.1:7420"}, nil, "bad endpoint"},
		{"grpc scheme", []string{"grpc://127.0.0.1:7420"}, nil, "bad endpoint"},
		{"a path", []string{"http://127.0.0.1:7420/lockd"}, nil, "only a scheme"},
		{"empty port", []string{"http://127.0.0.1:"}, nil, "empty port"},
		{"zero port", []string{"http://127.0.0.1:0"}, nil, "port must be"},
		{"zero port, https", []string{"https://lockd.example:00"}, nil, "port must be"},
		{"port out of range", []string{"http://127.0.0.1:65536"}, nil, "port must be"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Dial(tc.endpoints, tc.opts...)
			if err == nil {
				c.Close()
				t.Fatalf("Dial(%v) succeeded", tc.endpoints)
			}
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Dial(%v): %v; want ErrInvalidArgument mentioning %q", tc.endpoints, err, tc.want)
			}
		})
	}
}

func TestDialAccepts(t *testing.T) {
	tok := tokenFile(t, "s3cret\n")
	cases := []struct {
		name      string
		endpoints []string
		opts      []Option
	}{
		{"bearer over plaintext to loopback", []string{"http://127.0.0.1:7420", "http://localhost:7421", "http://[::1]:7422"}, []Option{WithBearerTokenFile(tok)}},
		{"bearer over TLS to another host", []string{"https://lockd.example:7420"}, []Option{WithBearerToken("x")}},
		{"plaintext without credentials", []string{"http://lockd.example:7420"}, nil},
		{"default port", []string{"https://lockd.example"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Dial(tc.endpoints, tc.opts...)
			if err != nil {
				t.Fatalf("Dial(%v): %v", tc.endpoints, err)
			}
			if tc.opts != nil && c.auth != "Bearer s3cret" && c.auth != "Bearer x" {
				t.Fatalf("auth header %q", c.auth)
			}
			c.Close()
		})
	}
}

func TestAcquireChecksBeforeCalling(t *testing.T) {
	c, err := Dial([]string{"http://127.0.0.1:1"}) // nothing is called
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		resource string
		o        AcquireOptions
	}{
		{"has space", AcquireOptions{}},
		{"", AcquireOptions{}},
		{strings.Repeat("a", 257), AcquireOptions{}},
		{"r", AcquireOptions{TTL: -time.Second}},
		{"r", AcquireOptions{Wait: -time.Second}},
		{"r", AcquireOptions{Owner: "o", Permits: 3}},
		{"r", AcquireOptions{Owner: "o", Mode: Read}},
		{"r", AcquireOptions{Permits: 3, Mode: Write}},
		{"r", AcquireOptions{Permits: 1001}},
	} {
		if _, err := c.Acquire(ctx, tc.resource, tc.o); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Acquire(%q, %+v): %v, want ErrInvalidArgument", tc.resource, tc.o, err)
		}
	}
	if _, err := c.AcquireAll(ctx, []string{"a", "a"}, SetOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("AcquireAll with a duplicate: %v", err)
	}
}

func TestErrorKinds(t *testing.T) {
	rpc := func(c codes.Code, msg string) error { return status.Error(c, msg) }
	cases := []struct {
		err  error
		code string
		kind error
	}{
		{rpc(codes.FailedPrecondition, "not current"), "lease_not_current", ErrLeaseNotCurrent},
		{rpc(codes.FailedPrecondition, "other"), "something_else", ErrRejected},
		{rpc(codes.Unauthenticated, "who"), "", ErrUnauthenticated},
		{rpc(codes.Unauthenticated, "who"), "", ErrPermissionDenied},
		{rpc(codes.PermissionDenied, "no"), "permission_denied", ErrPermissionDenied},
		{rpc(codes.ResourceExhausted, "full"), "queue_full", ErrQuotaExceeded},
		{rpc(codes.Unavailable, "connection refused"), "", ErrUnavailable},
		{rpc(codes.Unavailable, "authentication handshake failed: tls: bad certificate"), "", ErrTLS},
		{rpc(codes.InvalidArgument, "bad"), "", ErrInvalidArgument},
	}
	for _, tc := range cases {
		got := fromRPC("acquire", "r", tc.err, tc.code)
		if !errors.Is(got, tc.kind) {
			t.Errorf("%v (%s): %v, want %v", tc.err, tc.code, got, tc.kind)
		}
		var e *Error
		if !errors.As(got, &e) || e.LockdCode != tc.code {
			t.Errorf("%v: not an *Error with lockd code %q", got, tc.code)
		}
	}
	if transient(rpc(codes.Unavailable, "x509: certificate signed by unknown authority")) {
		t.Error("a TLS failure is retried")
	}
	busy := &NotGrantedError{Resource: "r"}
	if !errors.Is(busy, ErrBusy) || !errors.Is(busy, ErrNotGranted) || errors.Is(busy, ErrWaitTimedOut) {
		t.Error("busy kinds")
	}
	stale := &FenceError{Stale: true}
	if !errors.Is(stale, ErrStaleToken) || !errors.Is(stale, ErrFenceRefused) {
		t.Error("stale kinds")
	}
	if errors.Is(&FenceError{}, ErrStaleToken) {
		t.Error("a refusal is not stale")
	}
}

// An acquire that gives up checking an earlier attempt's grant says it was the acquire, and
// keeps the renewal's kind.
func TestAFailedCheckOfAnEarlierGrantIsTheAcquiresError(t *testing.T) {
	renewal := fromRPC("renew", "r", status.Error(codes.Unavailable, "connection reset"), "")
	got := checkFailed("acquire", "r", renewal)
	var e *Error
	if !errors.As(got, &e) || e.Op != "acquire" || e.Resource != "r" {
		t.Fatalf("%v: not the acquire's *Error", got)
	}
	if !errors.Is(got, ErrUnavailable) || !strings.Contains(got.Error(), "earlier attempt") ||
		!strings.Contains(got.Error(), "connection reset") {
		t.Errorf("%v: the renewal's kind, cause or the reason is missing", got)
	}
	if !strings.HasPrefix(got.Error(), "lockd: acquire r: ") {
		t.Errorf("%v: does not read as the acquire's error", got)
	}
	set := checkFailed("acquire all", "", renewal)
	if !strings.HasPrefix(set.Error(), "lockd: acquire all: ") || !strings.Contains(set.Error(), "renewal of r") {
		t.Errorf("%v: the set's error does not say which member's check failed", set)
	}
}

func TestLocalDeadlineMargin(t *testing.T) {
	if SafetyMargin(30*time.Second) != 3*time.Second || SafetyMargin(50*time.Millisecond) != 10*time.Millisecond {
		t.Fatal("safety margin")
	}
	var b backoffState
	for i, max := range []time.Duration{50, 100, 200, 400, 800, 1000, 1000} {
		d := b.next()
		if d < max*time.Millisecond/2 || d > max*time.Millisecond {
			t.Fatalf("delay %d: %v not within [%v, %v]", i, d, max*time.Millisecond/2, max*time.Millisecond)
		}
	}
}

func TestOnlyAFailedConnectionCountsAsNeverSent(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:9: connect: connection refused"`), true},
		{status.Error(codes.Unavailable, "error reading from server: EOF"), false},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false},
	}
	for _, c := range cases {
		if got := neverSent(c.err); got != c.want {
			t.Errorf("neverSent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
