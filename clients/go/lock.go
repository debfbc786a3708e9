package lockd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "lockd.dev/client/internal/lockpb"
)

const (
	backoffMin = 50 * time.Millisecond
	backoffMax = time.Second
)

// backoffState gives retry delays: 50 ms doubling to 1 s, each drawn from the upper half of
// its base.
type backoffState struct{ base time.Duration }

func (b *backoffState) next() time.Duration {
	if b.base == 0 {
		b.base = backoffMin
	}
	base := b.base
	b.base = min(base*2, backoffMax)
	return base/2 + rand.N(base/2+1)
}

func (b *backoffState) reset() { b.base = 0 }

func jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.9 + 0.2*rand.Float64()))
}

func isExhausted(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.ResourceExhausted
}

// SafetyMargin is how much earlier than lockd a lease is considered over: a tenth of the TTL,
// at least 10 ms (the clocks' rate difference, and the time to notice and stop).
func SafetyMargin(ttl time.Duration) time.Duration {
	return max(ttl/10, 10*time.Millisecond)
}

// Lease is a lease as lockd granted it.
type Lease struct {
	Resource string // the lease's resource (a semaphore's permit, a reader's slot)
	// LeaseID is the capability to renew and release: keep it secret (never log it).
	LeaseID     string
	Token       uint64
	SignedToken string // TOKEN.KEY_ID.MAC when lockd signs tokens, else empty
	TTL         time.Duration
	Holds       uint32
	Owner       string
	Duplicate   bool
}

// FenceToken is the token as fence-proxy wants it: the signed form when lockd signs, else the
// number.
func (l Lease) FenceToken() string {
	if l.SignedToken != "" {
		return l.SignedToken
	}
	return strconv.FormatUint(l.Token, 10)
}

func leaseOf(resource string, g *pb.Lease, owner string) Lease {
	return Lease{
		Resource: leaseResource(resource, g), LeaseID: g.GetLeaseId(), Token: g.GetToken(),
		SignedToken: g.GetSignedToken(), TTL: time.Duration(g.GetTtlMs()) * time.Millisecond,
		Holds: max(g.GetHolds(), 1), Owner: owner, Duplicate: g.GetDuplicate(),
	}
}

// Lock is a held lock. It renews itself every TTL/3 (±10%) in a goroutine and closes Done()
// when it is lost: when lockd refuses a renewal, or when no renewal was confirmed before the
// lease's local deadline (the send time of the request that last extended it, plus the TTL,
// minus SafetyMargin). That deadline ends before lockd's: stop working under the token when
// Done() is closed. Release it when done (idempotent).
type Lock struct {
	c     *Client
	lease Lease

	mu       sync.Mutex
	deadline time.Time
	err      error
	ended    bool

	done     chan struct{} // closed when lost
	stop     chan struct{} // closed by Release / Detach
	stopped  chan struct{} // closed when the renewal goroutine has returned
	stopOnce sync.Once
}

func (c *Client) newLock(lease Lease, extendedAt time.Time) *Lock {
	l := &Lock{
		c: c, lease: lease, deadline: extendedAt.Add(lease.TTL - SafetyMargin(lease.TTL)),
		done: make(chan struct{}), stop: make(chan struct{}), stopped: make(chan struct{}),
	}
	go l.renewLoop()
	return l
}

// Resource is the lease's resource: the one asked for, a semaphore's permit
// (RESOURCE@permit-K) or a reader's slot (RESOURCE@read-K). Fence with this name.
func (l *Lock) Resource() string { return l.lease.Resource }

// Token is the fencing token's number.
func (l *Lock) Token() uint64 { return l.lease.Token }

// SignedToken is the token signed by lockd (TOKEN.KEY_ID.MAC), or empty when lockd does not sign.
func (l *Lock) SignedToken() string { return l.lease.SignedToken }

// FenceToken is the token to attach to every write: the signed one when present.
func (l *Lock) FenceToken() string { return l.lease.FenceToken() }

// Holds is how many times the owner holds a reentrant lease (1 otherwise).
func (l *Lock) Holds() uint32 { return l.lease.Holds }

// TTL is the lease's length.
func (l *Lock) TTL() time.Duration { return l.lease.TTL }

// LeaseID is the lease's id: a capability, keep it secret.
func (l *Lock) LeaseID() string { return l.lease.LeaseID }

// Lease is the lease as granted.
func (l *Lock) Lease() Lease { return l.lease }

// Deadline is the lease's current local deadline.
func (l *Lock) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed when the lock is lost (never by Release or Detach).
func (l *Lock) Done() <-chan struct{} { return l.done }

// Err is nil while the lock is not lost, then a *LostError (errors.Is ErrLockLost; for a
// refused renewal also ErrLeaseNotCurrent).
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Reason is why the lock was lost (0 while it is not).
func (l *Lock) Reason() LostReason {
	var lost *LostError
	if errors.As(l.Err(), &lost) {
		return lost.Reason
	}
	return 0
}

func (l *Lock) String() string {
	return "Lock(" + l.lease.Resource + ", token " + strconv.FormatUint(l.lease.Token, 10) + ")"
}

func (l *Lock) lose(reason LostReason, cause error) {
	l.loseOnce(reason, cause, false)
}

// loseOnce signals the loss once; not for a lock already ended (released, detached), unless
// endedToo (a downgrade that failed after the renewals stopped).
func (l *Lock) loseOnce(reason LostReason, cause error, endedToo bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if (l.ended && !endedToo) || l.err != nil {
		return
	}
	l.err = &LostError{Resource: l.lease.Resource, Token: l.lease.Token, Reason: reason, Err: cause}
	close(l.done)
}

func (l *Lock) renewLoop() {
	defer close(l.stopped)
	ttl := l.lease.TTL
	interval, margin := ttl/3, SafetyMargin(ttl)
	nextAt := time.Now().Add(jittered(interval))
	var bo backoffState
	var lastErr error
	stopCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-l.stop
		cancel()
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		deadline := l.Deadline()
		wake := nextAt
		if deadline.Before(wake) {
			wake = deadline
		}
		timer.Reset(max(time.Until(wake), 0))
		select {
		case <-l.stop:
			return
		case <-timer.C:
		}
		now := time.Now()
		if !now.Before(deadline) {
			l.lose(DeadlinePassed, lastErr)
			return
		}
		if now.Before(nextAt) {
			continue
		}
		sent := time.Now()
		// Each renewal is bounded by the local deadline: an answer after it is of no use.
		rctx, rcancel := context.WithDeadline(stopCtx, deadline)
		_, err := l.c.Renew(rctx, l.lease.Resource, l.lease.LeaseID)
		rcancel()
		select {
		case <-l.stop:
			return
		default:
		}
		switch {
		case err == nil:
			l.mu.Lock()
			l.deadline = sent.Add(ttl - margin)
			l.mu.Unlock()
			bo.reset()
			lastErr = nil
			nextAt = sent.Add(jittered(interval))
		case errors.Is(err, ErrLeaseNotCurrent):
			l.lose(NotCurrent, err)
			return
		case errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded):
			lastErr = err
			nextAt = time.Now().Add(bo.next())
		default:
			l.lose(RenewRefused, err)
			return
		}
	}
}

// stopRenewing stops the renewal goroutine; false when the lock had already ended.
func (l *Lock) stopRenewing() bool {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return false
	}
	l.ended = true
	l.mu.Unlock()
	close(l.stop)
	<-l.stopped
	return true
}

// Release stops renewing and releases the lease (one hold of a reentrant one): true when this
// call ended it at lockd; false when it was not current any more (lost), or already released
// or detached (then without a call).
func (l *Lock) Release(ctx context.Context) (bool, error) {
	if !l.stopRenewing() {
		return false, nil
	}
	return l.c.Release(ctx, l.lease.Resource, l.lease.LeaseID)
}

// Detach stops renewing without releasing, and hands the lease over.
func (l *Lock) Detach() Lease {
	l.stopRenewing()
	return l.lease
}

// Reenter takes one more hold of this reentrant lease (acquired with an Owner): the same lease
// and token, as a Lock of its own that releases that hold. ErrLeaseNotCurrent when the lease
// has ended.
func (l *Lock) Reenter(ctx context.Context) (*Lock, error) {
	if l.lease.Owner == "" {
		return nil, invalid("reenter", l.lease.Resource, "the lease has no owner: acquire it with one to reenter it")
	}
	inner, err := l.c.Acquire(ctx, l.lease.Resource, AcquireOptions{TTL: l.lease.TTL, Owner: l.lease.Owner})
	if err != nil && !errors.Is(err, ErrBusy) {
		return nil, err
	}
	if inner == nil || inner.lease.LeaseID != l.lease.LeaseID {
		if inner != nil {
			_, _ = inner.Release(ctx)
		}
		return nil, &Error{Kind: ErrLeaseNotCurrent, Op: "reenter", Resource: l.lease.Resource,
			Message: "the lease with token " + strconv.FormatUint(l.lease.Token, 10) + " has ended"}
	}
	return inner, nil
}

// Downgrade trades this write lease of a read-write lock for a read lease in one step at
// lockd (no writer comes in between). This Lock ends either way: when the downgrade fails,
// its lease is released and the Lock is lost (Done closed, Err a *LostError, NotCurrent).
func (l *Lock) Downgrade(ctx context.Context) (*Lock, error) {
	if !l.stopRenewing() {
		return nil, &Error{Kind: ErrLeaseNotCurrent, Op: "downgrade", Resource: l.lease.Resource,
			Message: "this Lock has ended (released, detached or downgraded before)"}
	}
	r, err := l.c.acquire(ctx, l.lease.Resource, AcquireOptions{TTL: l.lease.TTL, Mode: Read, downgrade: l.lease.LeaseID})
	if err != nil {
		_, _ = l.c.Release(context.WithoutCancel(ctx), l.lease.Resource, l.lease.LeaseID)
		l.loseOnce(NotCurrent, fmt.Errorf("the downgrade failed and the lease was released: %w", err), true)
		return nil, err
	}
	return r, nil
}

// LockSet is several held locks (AcquireAll, AcquireOrdered).
type LockSet struct {
	Locks []*Lock
}

// Release releases every lock, last first: true when each was current. The first error is
// returned after trying them all.
func (s *LockSet) Release(ctx context.Context) (bool, error) {
	all := true
	var first error
	for i := len(s.Locks) - 1; i >= 0; i-- {
		ok, err := s.Locks[i].Release(ctx)
		if err != nil && first == nil {
			first = err
		}
		all = all && ok
	}
	return all, first
}
