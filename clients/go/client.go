// Package lockd is the Go SDK of lockd, a lock service whose fencing tokens are checked at the
// storage by fence-proxy.
//
//	client, err := lockd.Dial([]string{"http://127.0.0.1:7420"})
//	lock, err := client.Acquire(ctx, "inventory:sku-1", lockd.AcquireOptions{TTL: 30 * time.Second, Wait: 10 * time.Second})
//	defer lock.Release(context.Background())
//	err = fence.Tx(ctx, pool, lock, func(tx pgx.Tx) error { ... })  // package lockd.dev/client/fence
//	select { case <-lock.Done(): /* lost: stop, see lock.Err() */ ... }
//
// What the SDK does for the caller: an acquire carries a request id, kept across its own
// transport retries, so a grant whose answer was lost is returned, never doubled; a held Lock
// renews itself every TTL/3 and closes Done() when it is lost (a renewal refused, or its local
// deadline passed without a confirmed renewal).
package lockd

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "lockd.dev/client/internal/lockpb"
)

const (
	// DefaultEndpoint is lockd's default address.
	DefaultEndpoint = "http://127.0.0.1:7420"
	// TransportRetryFor is how long transport failures are retried past the caller's wait.
	TransportRetryFor = 10 * time.Second
	// callGrace is the time allowed for a call beyond the wait it asks lockd for.
	callGrace = 5 * time.Second
	// callWaitMax is the longest wait asked for in one call (lockd's default wait_max_ms).
	callWaitMax = 300 * time.Second
	// callTimeout bounds the calls that do not wait (describe, release, renew without a lock).
	callTimeout = 10 * time.Second
)

var resourceRE = regexp.MustCompile(`^[A-Za-z0-9\-_.:/@]{1,256}$`)

func checkResource(op, resource string) error {
	if !resourceRE.MatchString(resource) {
		return invalid(op, resource, "bad resource name %q: 1-256 bytes, allowed are ASCII letters, digits and - _ . : / @", resource)
	}
	return nil
}

// Option configures Dial.
type Option func(*settings)

type settings struct {
	caFile, certFile, keyFile string
	token                     *string
	tokenFile                 string
	holder                    string
	dialOptions               []grpc.DialOption
}

// WithCAFile trusts the CA certificates (PEM) of caFile for https:// endpoints (by default,
// the system's roots).
func WithCAFile(caFile string) Option { return func(s *settings) { s.caFile = caFile } }

// WithClientCert presents a client certificate (mutual TLS) from PEM files.
func WithClientCert(certFile, keyFile string) Option {
	return func(s *settings) { s.certFile, s.keyFile = certFile, keyFile }
}

// WithBearerTokenFile sends the bearer token read from path with every call (a lockd with a
// policy). Refused over plaintext to a host other than this one.
func WithBearerTokenFile(path string) Option { return func(s *settings) { s.tokenFile = path } }

// WithBearerToken sends token with every call, as WithBearerTokenFile.
func WithBearerToken(token string) Option { return func(s *settings) { s.token = &token } }

// WithHolder sets how this process describes itself to lockd (default HOST:PID).
func WithHolder(holder string) Option { return func(s *settings) { s.holder = holder } }

// WithDialOptions adds gRPC dial options (after the SDK's own).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(s *settings) { s.dialOptions = append(s.dialOptions, opts...) }
}

type endpoint struct {
	url      string
	target   string
	tls      bool
	loopback bool
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func parseEndpoint(raw string) (endpoint, error) {
	bad := func(why string) (endpoint, error) {
		return endpoint{}, invalid("dial", "", "bad endpoint %q: %s", raw, why)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return bad("expected http://HOST:PORT or https://HOST:PORT")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "" {
		return bad("only a scheme, a host and a port")
	}
	port := u.Port()
	if port == "" && strings.HasSuffix(u.Host, ":") {
		return bad("an empty port")
	}
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return bad("the port must be 1..65535")
	}
	host := u.Hostname()
	return endpoint{url: raw, target: net.JoinHostPort(host, port), tls: u.Scheme == "https", loopback: isLoopback(host)}, nil
}

func readFile(path, what string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, invalid("dial", "", "cannot read the %s %s: %v", what, path, err)
	}
	return b, nil
}

// Client is a client of one or several lockd endpoints: calls go to the current one and move
// to the next after UNAVAILABLE. Safe for concurrent use; share one per process.
type Client struct {
	eps     []endpoint
	conns   []*grpc.ClientConn
	stubs   []pb.LockServiceClient
	auth    string // "Bearer TOKEN", or empty
	holder  string
	mu      sync.Mutex
	current int
}

// Dial checks the endpoints and credentials and makes a client (connections are made on first
// use). No endpoint: $LOCKD_ENDPOINT (comma-separated), else DefaultEndpoint.
func Dial(endpoints []string, opts ...Option) (*Client, error) {
	var s settings
	for _, o := range opts {
		o(&s)
	}
	if len(endpoints) == 0 {
		env := os.Getenv("LOCKD_ENDPOINT")
		if env == "" {
			env = DefaultEndpoint
		}
		for _, e := range strings.Split(env, ",") {
			if e = strings.TrimSpace(e); e != "" {
				endpoints = append(endpoints, e)
			}
		}
		if len(endpoints) == 0 {
			return nil, invalid("dial", "", "no endpoint given")
		}
	}
	var eps []endpoint
	for _, raw := range endpoints {
		ep, err := parseEndpoint(raw)
		if err != nil {
			return nil, err
		}
		if len(eps) > 0 && ep.tls != eps[0].tls {
			return nil, invalid("dial", "", "the endpoints mix http:// and https://: use one scheme")
		}
		eps = append(eps, ep)
	}
	useTLS := eps[0].tls
	if (s.certFile == "") != (s.keyFile == "") {
		return nil, invalid("dial", "", "a client certificate needs its key, and a key its certificate")
	}
	if !useTLS && (s.caFile != "" || s.certFile != "") {
		return nil, invalid("dial", "", "TLS files are given but the endpoints are http://; use https://")
	}
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if useTLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if s.caFile != "" {
			pem, err := readFile(s.caFile, "CA file")
			if err != nil {
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, invalid("dial", "", "the CA file %s holds no PEM certificate", s.caFile)
			}
			cfg.RootCAs = pool
		}
		if s.certFile != "" {
			cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
			if err != nil {
				return nil, invalid("dial", "", "cannot load the client certificate %s and key %s: %v", s.certFile, s.keyFile, err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(cfg)
	}
	if s.token != nil && s.tokenFile != "" {
		return nil, invalid("dial", "", "give a bearer token or a token file, not both")
	}
	var token *string
	if s.tokenFile != "" {
		b, err := readFile(s.tokenFile, "token file")
		if err != nil {
			return nil, err
		}
		t := string(b)
		token = &t
	} else {
		token = s.token
	}
	auth := ""
	if token != nil {
		t := strings.TrimSpace(*token)
		if t == "" || strings.IndexFunc(t, func(r rune) bool { return r < 33 || r > 126 }) >= 0 {
			return nil, invalid("dial", "", "bearer token: it must be printable ASCII without spaces")
		}
		if !useTLS {
			for _, ep := range eps {
				if !ep.loopback {
					return nil, invalid("dial", "", "bearer token: not sent over plaintext to another host (%s); use an https:// endpoint", ep.url)
				}
			}
		}
		auth = "Bearer " + t
	}
	holder := s.holder
	if holder == "" {
		host, _ := os.Hostname()
		holder = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	dialOpts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 20 * time.Second}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, s.dialOptions...)
	c := &Client{eps: eps, auth: auth, holder: holder}
	for _, ep := range eps {
		conn, err := grpc.NewClient("passthrough:///"+ep.target, dialOpts...)
		if err != nil {
			c.Close()
			return nil, invalid("dial", "", "endpoint %s: %v", ep.url, err)
		}
		c.conns = append(c.conns, conn)
		c.stubs = append(c.stubs, pb.NewLockServiceClient(conn))
	}
	return c, nil
}

// Close closes the connections. Locks still held stop renewing when their next renewal fails.
func (c *Client) Close() error {
	for _, conn := range c.conns {
		conn.Close()
	}
	return nil
}

func (c *Client) stub() (int, pb.LockServiceClient) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current, c.stubs[c.current]
}

func (c *Client) failed(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current == i {
		c.current = (i + 1) % len(c.stubs)
	}
}

func (c *Client) outgoing(ctx context.Context) context.Context {
	if c.auth == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", c.auth)
}

func lockdCode(md metadata.MD) string {
	if v := md.Get(ErrorCodeKey); len(v) > 0 {
		return v[0]
	}
	return ""
}

// callOnce makes one call to the current endpoint; a transient failure moves to the next.
// It returns lockd's error code from the trailers.
func callOnce[Req, Resp any](c *Client, ctx context.Context, timeout time.Duration,
	method func(pb.LockServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, string, error) {
	i, stub := c.stub()
	cctx, cancel := context.WithTimeout(c.outgoing(ctx), timeout)
	defer cancel()
	var trailer metadata.MD
	resp, err := method(stub, cctx, req, grpc.Trailer(&trailer))
	if err != nil && transient(err) {
		c.failed(i)
	}
	return resp, lockdCode(trailer), err
}

// call makes a call that is safe to repeat: tried on each endpoint once while they are
// unreachable.
func call[Req, Resp any](c *Client, ctx context.Context, op, resource string, timeout time.Duration,
	method func(pb.LockServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	return callWhile(c, ctx, op, resource, timeout, method, req, transient)
}

// neverSent says whether a call failed before it was sent: no connection to the endpoint
// could be made.
func neverSent(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	msg := strings.ToLower(st.Message())
	return strings.Contains(msg, "error while dialing") || strings.Contains(msg, "connection refused")
}

// callWhile makes a call, tried on the next endpoint while again(err) says so.
func callWhile[Req, Resp any](c *Client, ctx context.Context, op, resource string, timeout time.Duration,
	method func(pb.LockServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req,
	again func(error) bool) (Resp, error) {
	var zero Resp
	var lastErr error
	var lastCode string
	for range c.eps {
		resp, code, err := callOnce(c, ctx, timeout, method, req)
		if err == nil {
			return resp, nil
		}
		if ctx.Err() != nil {
			return zero, cancelled(op, resource, ctx)
		}
		lastErr, lastCode = err, code
		if !again(err) {
			break
		}
	}
	return zero, fromRPC(op, resource, lastErr, lastCode)
}

func cancelled(op, resource string, ctx context.Context) error {
	if resource == "" {
		return fmt.Errorf("lockd: %s: %w", op, context.Cause(ctx))
	}
	return fmt.Errorf("lockd: %s %s: %w", op, resource, context.Cause(ctx))
}

// Mode is what an acquire asks of a read-write lock.
type Mode int

const (
	// Exclusive: a lock, or a semaphore's permit (the default).
	Exclusive Mode = iota
	// Read: a reader's lease, shared with other readers.
	Read
	// Write: the writer's lease, alone.
	Write
)

// AcquireOptions are the options of Acquire. The zero value is a try with lockd's default TTL.
type AcquireOptions struct {
	// TTL is the lease's length; 0 = lockd's default (30 s unless configured).
	TTL time.Duration
	// Wait is how long to wait in the resource's queue; 0 = try once.
	Wait time.Duration
	// RequestID makes the acquire idempotent (a retry with the same id returns the original
	// grant); empty = a fresh random id, kept across the SDK's own retries.
	RequestID string
	// Owner makes the lock reentrant for this owner (exclusive locks only).
	Owner string
	// Permits: 0 = a lock; N (1..1000) = one of the N permits of the semaphore resource.
	Permits uint32
	// Mode: Read or Write for a read-write lock.
	Mode Mode
	// Holder overrides the client's holder for this lock.
	Holder string

	downgrade string
}

func checkAcquire(resource string, o AcquireOptions) error {
	if err := checkResource("acquire", resource); err != nil {
		return err
	}
	switch {
	case o.TTL < 0:
		return invalid("acquire", resource, "TTL must be positive, not %v", o.TTL)
	case o.Wait < 0:
		return invalid("acquire", resource, "wait must be zero or positive, not %v", o.Wait)
	case o.Permits > 1000:
		return invalid("acquire", resource, "permits must be 0 (a lock) or 1..1000, not %d", o.Permits)
	case o.Owner != "" && (o.Permits != 0 || o.Mode != Exclusive):
		return invalid("acquire", resource, "owner (reentrancy) is for exclusive locks, not semaphores or read-write locks")
	case o.Permits != 0 && o.Mode != Exclusive:
		return invalid("acquire", resource, "permits and mode do not go together")
	case o.Mode < Exclusive || o.Mode > Write:
		return invalid("acquire", resource, "unknown mode %d", o.Mode)
	}
	return nil
}

// NewRequestID is a fresh random request id (128 bits, URL-safe).
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// NewOwnerID is a fresh random owner id, for reentrant locks.
func NewOwnerID() string { return NewRequestID() }

func ms(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Millisecond/2) / time.Millisecond)
}

func notGranted(resource string, ng *pb.NotGranted, waited bool) error {
	return &NotGrantedError{
		Resource: resource,
		TimedOut: ng.GetReason() == pb.NotGranted_WAIT_TIMEOUT || waited,
		Holder:   ng.GetHolder(), Token: ng.GetToken(), Waiters: ng.GetWaiters(),
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Acquire takes the lock of resource, waiting up to o.Wait (0: try once). Cancelling ctx ends
// the wait at once (lockd forgets the waiter); the error then wraps ctx's cause
// (errors.Is(err, context.Canceled)). A grant lockd made just as ctx ended is released by a
// background clean-up (the same request id asked again without waiting), not left held.
//
// Errors: *NotGrantedError (ErrBusy, ErrWaitTimedOut) and *Error (ErrInvalidArgument,
// ErrPermissionDenied, ErrUnauthenticated, ErrQuotaExceeded, ErrUnavailable, ErrTLS, ...).
// Transport failures are retried with the same request id (a grant whose answer was lost is
// returned, never doubled) until TransportRetryFor past the wait.
func (c *Client) Acquire(ctx context.Context, resource string, o AcquireOptions) (*Lock, error) {
	if err := checkAcquire(resource, o); err != nil {
		return nil, err
	}
	return c.acquire(ctx, resource, o)
}

func (c *Client) acquire(ctx context.Context, resource string, o AcquireOptions) (*Lock, error) {
	requestID := o.RequestID
	if requestID == "" {
		requestID = NewRequestID()
	}
	holder := o.Holder
	if holder == "" {
		holder = c.holder
	}
	deadline := time.Now().Add(o.Wait)
	var bo backoffState
	unanswered := false // the last call had no answer (it may have been granted)
	for {
		callWait := min(max(time.Until(deadline), 0), callWaitMax)
		req := &pb.AcquireRequest{
			Resource: resource, RequestId: requestID, TtlMs: ms(o.TTL), WaitTimeoutMs: ms(callWait),
			Holder: holder, Owner: o.Owner, Permits: o.Permits, Mode: pb.AcquireRequest_Mode(o.Mode),
			DowngradeLeaseId: o.downgrade,
		}
		sent := time.Now()
		resp, code, err := callOnce(c, ctx, callWait+callGrace, pb.LockServiceClient.Acquire, req)
		if ctx.Err() != nil {
			switch {
			case err == nil && resp.GetGranted() != nil:
				// An answer that came with the cancellation is a grant: end it.
				c.releaseAbandoned(ctx, resource, resp.GetGranted())
			case err != nil:
				// No answer: lockd may have granted it just as the call was cancelled.
				c.cleanUpAcquire(ctx, req)
			}
			return nil, cancelled("acquire", resource, ctx)
		}
		unanswered = err != nil
		if err != nil {
			exhausted := isExhausted(err)
			budget := deadline
			if !exhausted {
				budget = deadline.Add(TransportRetryFor)
			}
			if !(transient(err) || exhausted) || !time.Now().Before(budget) {
				return nil, fromRPC("acquire", resource, err, code)
			}
		} else {
			switch {
			case resp.GetGranted() != nil:
				g := resp.GetGranted()
				lease := leaseOf(resource, g, o.Owner)
				if !g.GetDuplicate() {
					return c.newLock(lease, sent), nil
				}
				// The grant of an earlier attempt whose answer was lost: nobody renewed it and
				// when it was made is unknown, so renew it now to learn a safe deadline. If it
				// has ended under an id this call made, it was never used: ask anew; under the
				// caller's own id it may have been, and is never granted twice.
				if g.GetHeld() {
					renewSent := time.Now()
					_, err := c.Renew(ctx, lease.Resource, lease.LeaseID)
					if err == nil {
						return c.newLock(lease, renewSent), nil
					}
					if ctx.Err() != nil {
						// Asked again under the same id and released: a release sent at once
						// could go out on the renewal's broken connection and be lost.
						c.cleanUpAcquire(ctx, req)
						return nil, cancelled("acquire", resource, ctx)
					}
					if !errors.Is(err, ErrLeaseNotCurrent) {
						// Not seen to end (the renewal did not get through): asked again
						// under the same id, as a transport failure of the acquire is.
						if !errors.Is(err, ErrUnavailable) || !time.Now().Before(deadline.Add(TransportRetryFor)) {
							return nil, checkFailed("acquire", resource, err)
						}
						// Cancelled in the pause below, the grant is asked for and released.
						unanswered = true
						break
					}
				}
				if o.RequestID != "" {
					return nil, grantEnded("acquire", resource, requestID)
				}
				requestID = NewRequestID()
				continue
			case resp.GetNotGranted() != nil:
				if !time.Now().Before(deadline) {
					return nil, notGranted(resource, resp.GetNotGranted(), o.Wait > 0)
				}
			default:
				return nil, &Error{Kind: ErrUnavailable, Op: "acquire", Resource: resource, Message: "lockd sent an empty AcquireResponse"}
			}
		}
		if !sleepCtx(ctx, bo.next()) {
			if unanswered {
				c.cleanUpAcquire(ctx, req)
			}
			return nil, cancelled("acquire", resource, ctx)
		}
	}
}

// cleanUpTimeout bounds the background clean-up of an abandoned acquire.
const cleanUpTimeout = 10 * time.Second

// cleanUpAcquire runs in the background after an acquire was abandoned (its context ended)
// without lockd's answer: lockd may have granted it just then, a lease nobody would renew or
// release, held for its whole TTL. It asks again with the same request id without waiting (a
// grant made is answered as a duplicate; a waiter still queued is replaced and ends) and
// releases any grant. A downgrade is asked again too: the Lock it came from has ended
// (Downgrade releases it on any failure), so whichever lease is left, the write lease turned
// into a reader by this call or the reader the given-up call made, is released.
func (c *Client) cleanUpAcquire(ctx context.Context, req *pb.AcquireRequest) {
	again := &pb.AcquireRequest{
		Resource: req.GetResource(), RequestId: req.GetRequestId(), TtlMs: req.GetTtlMs(), WaitTimeoutMs: 0,
		Holder: req.GetHolder(), Owner: req.GetOwner(), Permits: req.GetPermits(), Mode: req.GetMode(),
		DowngradeLeaseId: req.GetDowngradeLeaseId(),
	}
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanUpTimeout)
		defer cancel()
		// Asked again whatever the resource looks like: the given-up call may still be on its
		// way to lockd, and a resource free now would be granted to it next. This call either
		// finds that grant, or comes first: granted (and released here), the late call then
		// finds that grant ended; busy, the late call joins the queue and its cancellation,
		// sent after it, takes it out.
		resp, err := cleanUpCall(c, cctx, pb.LockServiceClient.Acquire, again)
		if err == nil && resp.GetGranted() != nil {
			g := resp.GetGranted()
			_, _ = c.Release(cctx, leaseResource(again.GetResource(), g), g.GetLeaseId())
		}
	}()
}

// cleanUpCall is a clean-up's one request, its transport failures retried with backoff until
// ctx ends (cleanUpTimeout): the given-up call's connection may have just broken, or the
// answer to this very request been lost (asked again under the same id, it is a duplicate).
func cleanUpCall[Req, Resp any](c *Client, ctx context.Context,
	method func(pb.LockServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) (Resp, error) {
	var bo backoffState
	for {
		resp, err := callWhile(c, ctx, "clean up", "", callGrace, method, req, transient)
		if err == nil || !errors.Is(err, ErrUnavailable) || !sleepCtx(ctx, bo.next()) {
			return resp, err
		}
	}
}

// releaseAbandoned releases, in the background, a grant whose acquire was abandoned.
func (c *Client) releaseAbandoned(ctx context.Context, resource string, g *pb.Lease) {
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanUpTimeout)
		defer cancel()
		_, _ = c.Release(cctx, leaseResource(resource, g), g.GetLeaseId())
	}()
}

func leaseResource(asked string, g *pb.Lease) string {
	if g.GetResource() != "" {
		return g.GetResource()
	}
	return asked
}

// Renew extends a lease once by its TTL (a Lock does this by itself). ErrLeaseNotCurrent when
// it is not current.
func (c *Client) Renew(ctx context.Context, resource, leaseID string) (ttl time.Duration, err error) {
	timeout := callTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	resp, err := call(c, ctx, "renew", resource, timeout, pb.LockServiceClient.Renew,
		&pb.RenewRequest{Resource: resource, LeaseId: leaseID})
	if err != nil {
		return 0, err
	}
	return time.Duration(resp.GetTtlMs()) * time.Millisecond, nil
}

// Release ends a lease (or one hold of a reentrant one) by its id: true when this call ended
// it, false when it was not current. The low-level call; a Lock has its own Release. It goes
// to another endpoint only when it never reached the first: a repeat would end one more hold
// of a reentrant lease.
func (c *Client) Release(ctx context.Context, resource, leaseID string) (bool, error) {
	resp, err := callWhile(c, ctx, "release", resource, callTimeout, pb.LockServiceClient.Release,
		&pb.ReleaseRequest{Resource: resource, LeaseId: leaseID}, neverSent)
	if err != nil {
		return false, err
	}
	return resp.GetReleased(), nil
}

// Description is who holds a resource, with which token, and how many wait.
type Description struct {
	Resource    string
	Held        bool
	Holder      string
	Token       uint64 // 0 when not held
	Waiters     uint32
	Holds       uint32 // when held: the owner's holds of a reentrant lease (1 otherwise)
	TTL         time.Duration
	Permits     uint32 // a semaphore in use: its permits, and how many are held
	PermitsHeld uint32
	ReadWrite   bool // a read-write lock in use, with Readers readers
	Readers     uint32
}

// Describe says who holds resource (never its lease id), with which token, and how many wait.
func (c *Client) Describe(ctx context.Context, resource string) (*Description, error) {
	if err := checkResource("describe", resource); err != nil {
		return nil, err
	}
	d, err := call(c, ctx, "describe", resource, callTimeout, pb.LockServiceClient.Describe,
		&pb.DescribeRequest{Resource: resource})
	if err != nil {
		return nil, err
	}
	out := &Description{Resource: resource, Held: d.GetHeld(), Holder: d.GetHolder(), Waiters: d.GetWaiters(),
		Permits: d.GetPermits(), PermitsHeld: d.GetPermitsHeld(), ReadWrite: d.GetReadWrite(), Readers: d.GetReaders()}
	if d.GetHeld() {
		out.Token = d.GetToken()
		out.Holds = max(d.GetHolds(), 1)
		out.TTL = time.Duration(d.GetTtlMs()) * time.Millisecond
	}
	return out, nil
}

// SetOptions are the options of AcquireAll and AcquireOrdered.
type SetOptions struct {
	TTL       time.Duration
	Wait      time.Duration
	RequestID string // AcquireAll only: names the whole set
	Holder    string
}

func checkSet(op string, resources []string) ([]string, error) {
	if len(resources) < 1 || len(resources) > 32 {
		return nil, invalid(op, "", "a set has 1 to 32 resources")
	}
	seen := map[string]bool{}
	for _, r := range resources {
		if err := checkResource(op, r); err != nil {
			return nil, err
		}
		if seen[r] {
			return nil, invalid(op, r, "a resource is named twice in the set")
		}
		seen[r] = true
	}
	sorted := append([]string(nil), resources...)
	sort.Strings(sorted)
	return sorted, nil
}

// AcquireAll takes every resource at once, or none (one commit at lockd; at most 32). Try-only
// at lockd: with a wait, asked again with backoff until it ends. The locks come back in the
// order asked. *NotGrantedError names the first held member.
func (c *Client) AcquireAll(ctx context.Context, resources []string, o SetOptions) (*LockSet, error) {
	if _, err := checkSet("acquire all", resources); err != nil {
		return nil, err
	}
	if o.TTL < 0 || o.Wait < 0 {
		return nil, invalid("acquire all", "", "TTL and wait must not be negative")
	}
	requestID := o.RequestID
	if requestID == "" {
		requestID = NewRequestID()
	}
	holder := o.Holder
	if holder == "" {
		holder = c.holder
	}
	deadline := time.Now().Add(o.Wait)
	var bo backoffState
	unanswered := false // the last call had no answer (it may have been granted)
	for {
		req := &pb.AcquireAllRequest{Resources: resources, RequestId: requestID, TtlMs: ms(o.TTL), Holder: holder}
		sent := time.Now()
		resp, code, err := callOnce(c, ctx, callGrace, pb.LockServiceClient.AcquireAll, req)
		if ctx.Err() != nil {
			switch {
			case err == nil && resp.GetGranted() != nil:
				c.releaseAbandonedSet(ctx, resources, resp.GetGranted().GetLeases())
			case err != nil:
				c.cleanUpAcquireAll(ctx, req)
			}
			return nil, cancelled("acquire all", "", ctx)
		}
		unanswered = err != nil
		if err != nil {
			if !transient(err) || !time.Now().Before(deadline.Add(TransportRetryFor)) {
				return nil, fromRPC("acquire all", "", err, code)
			}
		} else if set := resp.GetGranted(); set != nil {
			if len(set.GetLeases()) != len(resources) {
				return nil, &Error{Kind: ErrUnavailable, Op: "acquire all",
					Message: fmt.Sprintf("lockd answered %d leases for %d resources", len(set.GetLeases()), len(resources))}
			}
			leases := make([]Lease, len(resources))
			duplicate := false
			for i, g := range set.GetLeases() {
				leases[i] = leaseOf(resources[i], g, "")
				duplicate = duplicate || g.GetDuplicate()
			}
			if duplicate {
				sent = time.Now()
				var renewErr error
				for _, l := range leases {
					if _, renewErr = c.Renew(ctx, l.Resource, l.LeaseID); renewErr != nil {
						break
					}
				}
				if renewErr != nil {
					if ctx.Err() != nil {
						// Asked again under the same id and released (see Acquire's).
						c.cleanUpAcquireAll(ctx, req)
						return nil, cancelled("acquire all", "", ctx)
					}
					if !errors.Is(renewErr, ErrLeaseNotCurrent) {
						// Not seen to end: asked again under the same id.
						if !errors.Is(renewErr, ErrUnavailable) || !time.Now().Before(deadline.Add(TransportRetryFor)) {
							return nil, checkFailed("acquire all", "", renewErr)
						}
						if !sleepCtx(ctx, bo.next()) {
							c.cleanUpAcquireAll(ctx, req)
							return nil, cancelled("acquire all", "", ctx)
						}
						continue
					}
					if o.RequestID != "" {
						return nil, grantEnded("acquire all", "", requestID)
					}
					requestID = NewRequestID()
					continue
				}
			}
			locks := make([]*Lock, len(leases))
			for i, l := range leases {
				locks[i] = c.newLock(l, sent)
			}
			return &LockSet{Locks: locks}, nil
		} else if !time.Now().Before(deadline) {
			busy := resp.GetBusyResource()
			if busy == "" {
				busy = resources[0]
			}
			return nil, notGranted(busy, resp.GetNotGranted(), o.Wait > 0)
		}
		if !sleepCtx(ctx, bo.next()) {
			if unanswered {
				c.cleanUpAcquireAll(ctx, req)
			}
			return nil, cancelled("acquire all", "", ctx)
		}
	}
}

// cleanUpAcquireAll is cleanUpAcquire for a set: asks again with the same request id and
// releases any grant, in the background.
func (c *Client) cleanUpAcquireAll(ctx context.Context, req *pb.AcquireAllRequest) {
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanUpTimeout)
		defer cancel()
		resp, err := cleanUpCall(c, cctx, pb.LockServiceClient.AcquireAll, req)
		if err == nil && resp.GetGranted() != nil {
			releaseSet(c, cctx, req.GetResources(), resp.GetGranted().GetLeases())
		}
	}()
}

// releaseAbandonedSet releases, in the background, the grant of an abandoned AcquireAll.
func (c *Client) releaseAbandonedSet(ctx context.Context, resources []string, leases []*pb.Lease) {
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanUpTimeout)
		defer cancel()
		releaseSet(c, cctx, resources, leases)
	}()
}

func releaseSet(c *Client, ctx context.Context, resources []string, leases []*pb.Lease) {
	for i, g := range leases {
		if i < len(resources) {
			_, _ = c.Release(ctx, leaseResource(resources[i], g), g.GetLeaseId())
		}
	}
}

// AcquireOrdered takes each lock in sorted order, waiting in each queue, all within one
// o.Wait; on any failure it releases those taken, last first. Two callers never deadlock.
func (c *Client) AcquireOrdered(ctx context.Context, resources []string, o SetOptions) (*LockSet, error) {
	ordered, err := checkSet("acquire ordered", resources)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(o.Wait)
	var taken []*Lock
	for _, r := range ordered {
		l, err := c.Acquire(ctx, r, AcquireOptions{TTL: o.TTL, Wait: max(time.Until(deadline), 0), Holder: o.Holder})
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
			for i := len(taken) - 1; i >= 0; i-- {
				_, _ = taken[i].Release(rctx)
			}
			cancel()
			return nil, err
		}
		taken = append(taken, l)
	}
	return &LockSet{Locks: taken}, nil
}
