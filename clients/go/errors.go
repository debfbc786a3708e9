package lockd

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorCodeKey is the trailing metadata key of lockd's stable error code (docs/api.md).
const ErrorCodeKey = "lockd-error"

// kind is a sentinel error; a kind may have a parent it also matches with errors.Is.
type kind struct {
	name   string
	parent error
}

func (k *kind) Error() string { return "lockd: " + k.name }
func (k *kind) Unwrap() error { return k.parent }

// The kinds of error, to test with errors.Is. Every error of the SDK matches exactly one of
// them (and its parent: ErrUnauthenticated is also ErrPermissionDenied, ErrStaleToken also
// ErrFenceRefused, ErrBusy and ErrWaitTimedOut also ErrNotGranted).
var (
	// ErrNotGranted: the lock was not granted (ErrBusy or ErrWaitTimedOut). See *NotGrantedError.
	ErrNotGranted error = &kind{name: "not granted"}
	// ErrBusy: the resource was held and no wait was asked for (a try).
	ErrBusy error = &kind{name: "busy", parent: ErrNotGranted}
	// ErrWaitTimedOut: the wait ran out before the lock was handed over.
	ErrWaitTimedOut error = &kind{name: "wait timed out", parent: ErrNotGranted}
	// ErrInvalidArgument: the request or a setting is invalid as written (checked here, or
	// refused by lockd).
	ErrInvalidArgument error = &kind{name: "invalid argument"}
	// ErrLeaseNotCurrent: the lease is not the resource's current lease (expired, released,
	// or never was).
	ErrLeaseNotCurrent error = &kind{name: "lease not current"}
	// ErrPermissionDenied: the caller may not use this resource (another tenant's).
	ErrPermissionDenied error = &kind{name: "permission denied"}
	// ErrUnauthenticated: lockd has a policy and the call carried no identity it knows.
	ErrUnauthenticated error = &kind{name: "unauthenticated", parent: ErrPermissionDenied}
	// ErrQuotaExceeded: a limit of lockd or of the tenant (RESOURCE_EXHAUSTED); Error.LockdCode
	// says which (e.g. queue_full).
	ErrQuotaExceeded error = &kind{name: "quota exceeded"}
	// ErrUnavailable: lockd could not be reached, or did not answer, within the retry budget.
	ErrUnavailable error = &kind{name: "unavailable"}
	// ErrTLS: the TLS connection to lockd failed (a certificate refused on either side). Not
	// retried: nothing will change by itself.
	ErrTLS error = &kind{name: "TLS failure"}
	// ErrRejected: lockd refused the call for another reason (see Error.Code, Error.LockdCode).
	ErrRejected error = &kind{name: "rejected"}
	// ErrLockLost: the lock was lost (Lock.Err). See *LostError.
	ErrLockLost error = &kind{name: "lock lost"}
	// ErrFenceRefused: fence-proxy (or PostgreSQL's fence check) refused a write. See *FenceError.
	ErrFenceRefused error = &kind{name: "fence refused the write"}
	// ErrStaleToken: the write's token is older than one already accepted for its resource:
	// a newer holder exists, so stop working under this lock.
	ErrStaleToken error = &kind{name: "stale token", parent: ErrFenceRefused}
)

// Error is a failed call to lockd, or a request refused before it was sent.
type Error struct {
	Kind      error      // one of the Err* kinds
	Op        string     // "acquire", "renew", "release", "describe", "dial", ...
	Resource  string     // the resource, when the call had one
	Code      codes.Code // the gRPC status code (codes.OK when refused locally)
	LockdCode string     // lockd's stable error code (`lockd-error`), when it sent one
	Message   string
	Err       error // the cause (a gRPC status error), if any
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("lockd: ")
	if e.Op != "" {
		b.WriteString(e.Op)
		if e.Resource != "" {
			b.WriteString(" " + e.Resource)
		}
		b.WriteString(": ")
	}
	if k, ok := e.Kind.(*kind); ok {
		b.WriteString(k.name)
	} else if e.Kind != nil {
		b.WriteString(e.Kind.Error())
	}
	if e.Code != codes.OK {
		b.WriteString(" (" + e.Code.String())
		if e.LockdCode != "" {
			b.WriteString(", " + e.LockdCode)
		}
		b.WriteString(")")
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Unwrap gives the kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind}
}

// NotGrantedError is ErrBusy or ErrWaitTimedOut, with who held the lock.
type NotGrantedError struct {
	Resource string
	TimedOut bool   // a wait ran out (ErrWaitTimedOut); false: a try found it held (ErrBusy)
	Holder   string // the current holder, as it described itself
	Token    uint64 // its token (0 if none)
	Waiters  uint32
}

func (e *NotGrantedError) Error() string {
	what := "busy"
	if e.TimedOut {
		what = "the wait ran out"
	}
	held := ""
	if e.Token != 0 {
		held = fmt.Sprintf("; held by %q with token %d, %d waiting", e.Holder, e.Token, e.Waiters)
	}
	return fmt.Sprintf("lockd: %s: %s%s", e.Resource, what, held)
}

// Unwrap gives ErrWaitTimedOut or ErrBusy.
func (e *NotGrantedError) Unwrap() error {
	if e.TimedOut {
		return ErrWaitTimedOut
	}
	return ErrBusy
}

// LostReason says why a lock was lost.
type LostReason int

const (
	// DeadlinePassed: no renewal was confirmed before the lease's local deadline (lockd
	// unreachable or slow). lockd may still hold the lease, but cannot be relied on to.
	DeadlinePassed LostReason = iota + 1
	// NotCurrent: lockd said the lease is not current any more.
	NotCurrent
	// RenewRefused: a renewal was refused for another reason.
	RenewRefused
)

func (r LostReason) String() string {
	switch r {
	case DeadlinePassed:
		return "deadline_passed"
	case NotCurrent:
		return "not_current"
	case RenewRefused:
		return "renew_refused"
	}
	return "unknown"
}

// LostError is the reason a Lock was lost (Lock.Err). It matches ErrLockLost, and the cause's
// kind (ErrLeaseNotCurrent for NotCurrent).
type LostError struct {
	Resource string
	Token    uint64
	Reason   LostReason
	Err      error // the refusal, or the last failure before the deadline
}

func (e *LostError) Error() string {
	s := fmt.Sprintf("lockd: the lock of %s (token %d) was lost: %s", e.Resource, e.Token, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap gives ErrLockLost and the cause.
func (e *LostError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrLockLost, e.Err}
	}
	return []error{ErrLockLost}
}

// FenceError is a write refused by fence-proxy: ErrStaleToken (SQLSTATE FN001 or FN003, HTTP
// 409) or ErrFenceRefused (another FN00x, a forged or unsigned token, ...).
type FenceError struct {
	Stale    bool
	Code     string // the SQLSTATE (FN00x), or the HTTP problem's name (e.g. stale-token)
	Status   int    // the HTTP status; 0 for PostgreSQL
	Resource string // from the HTTP problem, when given
	Token    string
	Highest  uint64 // the highest accepted token, when given
	Message  string
	Err      error // the driver's error
}

func (e *FenceError) Error() string {
	what := "refused the write"
	if e.Stale {
		what = "refused a stale token"
	}
	s := "lockd: fence-proxy " + what + " (" + e.Code
	if e.Status != 0 {
		s += fmt.Sprintf(", HTTP %d", e.Status)
	}
	s += ")"
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap gives ErrStaleToken or ErrFenceRefused, and the driver's error.
func (e *FenceError) Unwrap() []error {
	k := ErrFenceRefused
	if e.Stale {
		k = ErrStaleToken
	}
	if e.Err != nil {
		return []error{k, e.Err}
	}
	return []error{k}
}

// grantEnded is the error for an acquire under the caller's own request id whose grant has
// ended since: acquiring again under it would grant one request twice (docs/api.md,
// request_id).
func grantEnded(op, resource, requestID string) error {
	return invalid(op, resource, "request id %q was granted before and that grant has ended (released or expired): "+
		"acquiring under it again would grant the same request twice; use a new request id to acquire again", requestID)
}

func invalid(op, resource, format string, args ...any) error {
	return &Error{Kind: ErrInvalidArgument, Op: op, Resource: resource, Message: fmt.Sprintf(format, args...)}
}

// transient: the same request may be sent again (it may not have reached lockd, or lockd
// could not serve it right now).
func transient(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Unknown, codes.Aborted, codes.Internal:
		return !tlsFailure(st)
	}
	return false
}

func tlsFailure(st *status.Status) bool {
	if st.Code() != codes.Unavailable {
		return false
	}
	msg := strings.ToLower(st.Message())
	for _, w := range []string{"tls:", "x509", "certificate", "handshake"} {
		if strings.Contains(msg, w) {
			return true
		}
	}
	return false
}

// fromRPC is the SDK's error for a failed call.
func fromRPC(op, resource string, err error, lockdCode string) error {
	st, ok := status.FromError(err)
	if !ok {
		return &Error{Kind: ErrUnavailable, Op: op, Resource: resource, Message: err.Error(), Err: err}
	}
	e := &Error{Op: op, Resource: resource, Code: st.Code(), LockdCode: lockdCode, Message: st.Message(), Err: err}
	switch {
	case tlsFailure(st):
		e.Kind = ErrTLS
	case st.Code() == codes.InvalidArgument:
		e.Kind = ErrInvalidArgument
	case st.Code() == codes.FailedPrecondition && (lockdCode == "" || lockdCode == "lease_not_current"):
		e.Kind = ErrLeaseNotCurrent
	case st.Code() == codes.Unauthenticated:
		e.Kind = ErrUnauthenticated
	case st.Code() == codes.PermissionDenied:
		e.Kind = ErrPermissionDenied
	case st.Code() == codes.ResourceExhausted:
		e.Kind = ErrQuotaExceeded
	case transient(err) || st.Code() == codes.Canceled:
		e.Kind = ErrUnavailable
	default:
		e.Kind = ErrRejected
	}
	return e
}

// checkFailed is the error of an acquire whose check of an earlier attempt's grant (a renewal)
// failed: the acquire's, with the renewal's kind and cause, so that errors.Is still tells
// ErrUnavailable from the rest.
func checkFailed(op, resource string, err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	out := *e
	out.Op, out.Resource = op, resource
	out.Message = "checking the grant of an earlier attempt under the same request id (a renewal of " +
		e.Resource + "): " + e.Message
	return &out
}
