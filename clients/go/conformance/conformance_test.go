// The SDK conformance suite (clients/conformance/scenarios.json, steps defined in
// clients/conformance/README.md), interpreted with the Go SDK against the servers of
// clients/testbed. The testbed binary is $LOCKD_TESTBED, else target/debug/testbed of the
// repository; missing, the tests fail with how to build it.
package conformance_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	lockd "lockd.dev/client"
)

var (
	here = func() string { _, f, _, _ := runtime.Caller(0); return filepath.Dir(f) }()
	repo = filepath.Join(here, "..", "..", "..")
	bed  *testbed
	// bedErr is why the testbed could not be started (every test then fails with it).
	bedErr error
)

type testbed struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stdout  *bufio.Reader
	servers map[string]json.RawMessage
	mu      sync.Mutex
}

func startTestbed() (*testbed, error) {
	binary := os.Getenv("LOCKD_TESTBED")
	if binary == "" {
		binary = filepath.Join(repo, "target", "debug", "testbed")
	}
	if _, err := os.Stat(binary); err != nil {
		return nil, fmt.Errorf("the testbed binary %s is missing: build it with `cargo build --workspace --bins` (or set LOCKD_TESTBED)", binary)
	}
	cmd := exec.Command(binary)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the testbed %s: %w", binary, err)
	}
	b := &testbed{cmd: cmd, stdin: stdin, stdout: bufio.NewReader(stdout)}
	line, err := b.stdout.ReadString('\n')
	if err != nil {
		stdin.Close()
		werr := cmd.Wait()
		return nil, fmt.Errorf("the testbed %s exited before describing its servers (%v); see its output above", binary, werr)
	}
	if err := json.Unmarshal([]byte(line), &b.servers); err != nil {
		return nil, fmt.Errorf("the testbed's first line is not JSON: %v: %q", err, line)
	}
	return b, nil
}

func (b *testbed) command(line string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := io.WriteString(b.stdin, line+"\n"); err != nil {
		return "", err
	}
	answer, err := b.stdout.ReadString('\n')
	if err != nil {
		return "", err
	}
	answer = strings.TrimSpace(answer)
	if !strings.HasPrefix(answer, "ok") {
		return "", fmt.Errorf("testbed %q: %s", line, answer)
	}
	return strings.TrimSpace(strings.TrimPrefix(answer, "ok")), nil
}

func (b *testbed) close() {
	b.stdin.Close()
	done := make(chan struct{})
	go func() { _ = b.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = b.cmd.Process.Kill()
	}
}

func TestMain(m *testing.M) {
	bed, bedErr = startTestbed()
	code := m.Run()
	if bed != nil {
		bed.close()
	}
	os.Exit(code)
}

type scenario struct {
	Name  string           `json:"name"`
	Needs string           `json:"needs"`
	Steps []map[string]any `json:"steps"`
}

func loadScenarios(t *testing.T) []scenario {
	raw, err := os.ReadFile(filepath.Join(repo, "clients", "conformance", "scenarios.json"))
	if err != nil {
		t.Fatalf("reading the scenarios: %v", err)
	}
	var file struct {
		Scenarios []scenario `json:"scenarios"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatalf("parsing scenarios.json: %v", err)
	}
	if len(file.Scenarios) == 0 {
		t.Fatal("scenarios.json holds no scenario")
	}
	return file.Scenarios
}

func TestConformance(t *testing.T) {
	if bedErr != nil {
		t.Fatal(bedErr)
	}
	for _, sc := range loadScenarios(t) {
		t.Run(sc.Name, func(t *testing.T) {
			r := newRun(t, sc)
			defer r.cleanup()
			for i, step := range sc.Steps {
				if err := r.step(step); err != nil {
					t.Fatalf("step %d %v: %v", i, step, err)
				}
			}
		})
	}
}

// held is what a lease name refers to: a lock or a set of locks.
type held struct {
	lock   *lockd.Lock
	set    *lockd.LockSet
	client *lockd.Client
}

func (h held) locks() []*lockd.Lock {
	if h.set != nil {
		return h.set.Locks
	}
	return []*lockd.Lock{h.lock}
}

func (h held) first() *lockd.Lock { return h.locks()[0] }

func (h held) release(ctx context.Context) (bool, error) {
	if h.set != nil {
		return h.set.Release(ctx)
	}
	return h.lock.Release(ctx)
}

type pending struct {
	cancel context.CancelFunc
	done   chan struct{}
	client *lockd.Client
	lock   *lockd.Lock
	err    error
}

type run struct {
	t        *testing.T
	sc       scenario
	id       string
	ctx      context.Context
	clients  map[string]*lockd.Client
	leases   map[string]held
	pending  map[string]*pending
	pausedAt time.Time
}

func newRun(t *testing.T, sc scenario) *run {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &run{t: t, sc: sc, id: hex.EncodeToString(b[:]), ctx: context.Background(),
		clients: map[string]*lockd.Client{}, leases: map[string]held{}, pending: map[string]*pending{}}
}

func (r *run) s(v any) string { return strings.ReplaceAll(fmt.Sprint(v), "{run}", r.id) }

func str(step map[string]any, key string) string {
	if v, ok := step[key].(string); ok {
		return v
	}
	return ""
}

func num(step map[string]any, key string) (float64, bool) {
	v, ok := step[key].(float64)
	return v, ok
}

func millis(step map[string]any, key string) time.Duration {
	v, _ := num(step, key)
	return time.Duration(v) * time.Millisecond
}

func (r *run) server(name, key string) (string, error) {
	var s map[string]any
	raw, ok := bed.servers[name]
	if !ok {
		return "", fmt.Errorf("the testbed has no server %q", name)
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", err
	}
	v, ok := s[key].(string)
	if !ok {
		return "", fmt.Errorf("the testbed's %s has no %s", name, key)
	}
	return v, nil
}

func (r *run) client(step map[string]any) error {
	var names []string
	if list, ok := step["servers"].([]any); ok {
		for _, n := range list {
			names = append(names, n.(string))
		}
	} else {
		names = []string{str(step, "server")}
	}
	var endpoints []string
	for _, n := range names {
		ep, err := r.server(n, "endpoint")
		if err != nil {
			return err
		}
		endpoints = append(endpoints, ep)
	}
	var opts []lockd.Option
	if names[0] == "secure" {
		var secure struct {
			CA      string                       `json:"ca"`
			Tenants map[string]map[string]string `json:"tenants"`
		}
		if err := json.Unmarshal(bed.servers["secure"], &secure); err != nil {
			return err
		}
		opts = append(opts, lockd.WithCAFile(secure.CA))
		tenant := secure.Tenants[str(step, "tenant")]
		if f, ok := tenant["token_file"]; ok {
			opts = append(opts, lockd.WithBearerTokenFile(f))
		}
		if c, ok := tenant["cert"]; ok {
			opts = append(opts, lockd.WithClientCert(c, tenant["key"]))
		}
	}
	c, err := lockd.Dial(endpoints, opts...)
	if err != nil {
		return err
	}
	r.clients[str(step, "name")] = c
	return nil
}

func (r *run) acquireOptions(step map[string]any) lockd.AcquireOptions {
	o := lockd.AcquireOptions{TTL: millis(step, "ttl_ms"), Wait: millis(step, "wait_ms")}
	if v := str(step, "request_id"); v != "" {
		o.RequestID = r.s(v)
	}
	if v := str(step, "owner"); v != "" {
		o.Owner = r.s(v)
	}
	if v, ok := num(step, "permits"); ok {
		o.Permits = uint32(v)
	}
	switch str(step, "mode") {
	case "read":
		o.Mode = lockd.Read
	case "write":
		o.Mode = lockd.Write
	}
	return o
}

// outcome names an acquire's error as the suite does.
func outcome(err error) string {
	switch {
	case err == nil:
		return "granted"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, lockd.ErrBusy):
		return "busy"
	case errors.Is(err, lockd.ErrWaitTimedOut):
		return "timeout"
	case errors.Is(err, lockd.ErrUnauthenticated):
		return "unauthenticated"
	case errors.Is(err, lockd.ErrPermissionDenied):
		return "permission_denied"
	case errors.Is(err, lockd.ErrInvalidArgument):
		return "invalid"
	case errors.Is(err, lockd.ErrUnavailable):
		return "unavailable"
	}
	return "error"
}

func (r *run) checkGrant(step map[string]any, name string, h held, err error) error {
	expect, got := str(step, "expect"), outcome(err)
	if got != expect {
		return fmt.Errorf("%s: expected %s, got %s: %v", name, expect, got, err)
	}
	if err != nil {
		return nil
	}
	r.leases[name] = h
	l := h.first()
	if other := str(step, "token_above"); other != "" {
		if o := r.leases[other].first(); l.Token() <= o.Token() {
			return fmt.Errorf("%s: token %d not above %s's %d", name, l.Token(), other, o.Token())
		}
	}
	if other := str(step, "same_token_as"); other != "" {
		if o := r.leases[other].first(); l.Token() != o.Token() {
			return fmt.Errorf("%s: token %d, expected %s's %d", name, l.Token(), other, o.Token())
		}
	}
	if v, ok := num(step, "holds"); ok && l.Holds() != uint32(v) {
		return fmt.Errorf("%s: holds %d, expected %v", name, l.Holds(), v)
	}
	if v := str(step, "resource_starts"); v != "" && !strings.HasPrefix(l.Resource(), r.s(v)) {
		return fmt.Errorf("%s: resource %s does not start with %s", name, l.Resource(), r.s(v))
	}
	if list, ok := step["resources_held"].([]any); ok {
		var want, have []string
		for _, v := range list {
			want = append(want, r.s(v))
		}
		for _, x := range h.locks() {
			have = append(have, x.Resource())
		}
		if strings.Join(want, ",") != strings.Join(have, ",") {
			return fmt.Errorf("%s: resources %v, expected %v", name, have, want)
		}
	}
	if signed, _ := step["signed"].(bool); signed {
		if l.SignedToken() == "" || l.FenceToken() != l.SignedToken() {
			return fmt.Errorf("%s: no signed token from a lockd that signs", name)
		}
		if !strings.HasPrefix(l.SignedToken(), fmt.Sprintf("%d.", l.Token())) {
			return fmt.Errorf("%s: signed token %q is not of token %d", name, l.SignedToken(), l.Token())
		}
	}
	return nil
}

func (r *run) step(step map[string]any) error {
	ctx := r.ctx
	switch op := str(step, "op"); op {
	case "client":
		return r.client(step)
	case "acquire":
		c := r.clients[str(step, "client")]
		l, err := c.Acquire(ctx, r.s(step["resource"]), r.acquireOptions(step))
		return r.checkGrant(step, str(step, "as"), held{lock: l, client: c}, err)
	case "start_acquire":
		c := r.clients[str(step, "client")]
		actx, cancel := context.WithCancel(ctx)
		p := &pending{cancel: cancel, done: make(chan struct{}), client: c}
		resource, o := r.s(step["resource"]), r.acquireOptions(step)
		go func() {
			defer close(p.done)
			p.lock, p.err = c.Acquire(actx, resource, o)
		}()
		r.pending[str(step, "as")] = p
	case "await":
		p := r.pending[str(step, "of")]
		select {
		case <-p.done:
		case <-time.After(120 * time.Second):
			return fmt.Errorf("%s did not finish", str(step, "of"))
		}
		return r.checkGrant(step, str(step, "of"), held{lock: p.lock, client: p.client}, p.err)
	case "cancel":
		r.pending[str(step, "of")].cancel()
	case "wait_free":
		c, resource := r.clients[str(step, "client")], r.s(step["resource"])
		deadline := time.Now().Add(10 * time.Second)
		for {
			d, err := c.Describe(ctx, resource)
			if err != nil {
				return err
			}
			if !d.Held && d.PermitsHeld == 0 && d.Readers == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s stayed held: %+v", resource, d)
			}
			time.Sleep(20 * time.Millisecond) // polling Describe, bounded
		}
	case "wait_waiters":
		c, resource := r.clients[str(step, "client")], r.s(step["resource"])
		want, _ := num(step, "waiters")
		deadline := time.Now().Add(60 * time.Second)
		for {
			d, err := c.Describe(ctx, resource)
			if err != nil {
				return err
			}
			if d.Waiters == uint32(want) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: never %v waiters (%d)", resource, want, d.Waiters)
			}
			time.Sleep(20 * time.Millisecond) // polling a condition, with a bound
		}
	case "release":
		got, err := r.leases[str(step, "lease")].release(ctx)
		if err != nil {
			return err
		}
		if want, _ := step["expect"].(bool); got != want {
			return fmt.Errorf("release of %s: %v, expected %v", str(step, "lease"), got, want)
		}
	case "end_behind":
		h := r.leases[str(step, "lease")]
		l := h.first()
		ok, err := h.client.Release(ctx, l.Resource(), l.LeaseID())
		if err != nil || !ok {
			return fmt.Errorf("end_behind %s: released %v, %v", str(step, "lease"), ok, err)
		}
	case "release_by_id":
		l := r.leases[str(step, "lease")].first()
		ok, err := r.clients[str(step, "client")].Release(ctx, l.Resource(), l.LeaseID())
		if err != nil {
			return fmt.Errorf("release_by_id %s: %v", str(step, "lease"), err)
		}
		if want, _ := step["expect"].(bool); ok != want {
			return fmt.Errorf("release_by_id %s: released %v, expected %v", str(step, "lease"), ok, want)
		}
	case "describe":
		d, err := r.clients[str(step, "client")].Describe(ctx, r.s(step["resource"]))
		if err != nil {
			return err
		}
		if v, ok := step["held"].(bool); ok && d.Held != v {
			return fmt.Errorf("held %v, expected %v: %+v", d.Held, v, d)
		}
		if v := str(step, "held_by"); v != "" {
			if tok := r.leases[v].first().Token(); !d.Held || d.Token != tok {
				return fmt.Errorf("expected held by %s (token %d): %+v", v, tok, d)
			}
		}
		if v, ok := num(step, "waiters"); ok && d.Waiters != uint32(v) {
			return fmt.Errorf("waiters %d, expected %v: %+v", d.Waiters, v, d)
		}
	case "pause":
		r.pausedAt = time.Now()
		_, err := bed.command("pause " + str(step, "server"))
		return err
	case "resume":
		_, err := bed.command("resume " + str(step, "server"))
		return err
	case "drop_next_answer":
		cmd := "drop-next-answer"
		if n, ok := num(step, "after"); ok {
			cmd = fmt.Sprintf("%s %d", cmd, int(n))
		}
		_, err := bed.command(cmd)
		return err
	case "cut_renewals":
		on, _ := step["on"].(bool)
		_, err := bed.command(map[bool]string{true: "cut-renewals on", false: "cut-renewals off"}[on])
		return err
	case "hold_next_call":
		after, _ := num(step, "after")
		_, err := bed.command(fmt.Sprintf("hold-next-call %d", int(after)))
		return err
	case "wait_held", "wait_held_answered":
		_, err := bed.command(strings.ReplaceAll(op, "_", "-"))
		return err
	case "wait_cuts":
		want, _ := num(step, "at_least")
		_, err := bed.command(fmt.Sprintf("wait-cuts %d", int(want)))
		return err
	case "await_lost":
		l := r.leases[str(step, "lease")].first()
		select {
		case <-l.Done():
		case <-time.After(60 * time.Second):
			return fmt.Errorf("%s: no loss signalled", str(step, "lease"))
		}
		lostAt := time.Now()
		if v, _ := step["within_ttl_of_pause"].(bool); v {
			if !lostAt.Before(r.pausedAt.Add(l.TTL())) {
				return fmt.Errorf("the loss came %v after the pause, not within the TTL %v", lostAt.Sub(r.pausedAt), l.TTL())
			}
			if l.Reason() != lockd.DeadlinePassed {
				return fmt.Errorf("lost for %v, expected %v: %v", l.Reason(), lockd.DeadlinePassed, l.Err())
			}
		}
		if str(step, "reason") == "not_current" {
			if l.Reason() != lockd.NotCurrent || !errors.Is(l.Err(), lockd.ErrLeaseNotCurrent) || !errors.Is(l.Err(), lockd.ErrLockLost) {
				return fmt.Errorf("lost for %v, expected not_current: %v", l.Reason(), l.Err())
			}
		}
	case "acquire_all", "acquire_ordered":
		c := r.clients[str(step, "client")]
		var resources []string
		for _, v := range step["resources"].([]any) {
			resources = append(resources, r.s(v))
		}
		ttl := millis(step, "ttl_ms")
		if ttl == 0 {
			ttl = 30 * time.Second
		}
		o := lockd.SetOptions{TTL: ttl, Wait: millis(step, "wait_ms")}
		if v := str(step, "request_id"); v != "" {
			o.RequestID = r.s(v)
		}
		var set *lockd.LockSet
		var err error
		if op == "acquire_all" {
			set, err = c.AcquireAll(ctx, resources, o)
		} else {
			set, err = c.AcquireOrdered(ctx, resources, o)
		}
		return r.checkGrant(step, str(step, "as"), held{set: set, client: c}, err)
	case "pg_write", "pg_read", "pg_pool_check", "http_write":
		return r.fenced(step)
	default:
		return fmt.Errorf("unknown step %q", op)
	}
	return nil
}

func (r *run) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range r.pending {
		p.cancel()
		<-p.done
		if p.lock != nil {
			_, _ = p.lock.Release(ctx)
		}
	}
	for _, h := range r.leases {
		_, _ = h.release(ctx)
	}
	for _, c := range r.clients {
		c.Close()
	}
}
