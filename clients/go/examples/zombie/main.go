// Command zombie is the zombie demo in Go: a holder whose process is paused for real
// (SIGSTOP) past its lease wakes up and writes; fence-proxy refuses the write because a newer
// holder has written.
//
//	go run ./examples/zombie        (from clients/go; or: ./x sdk-demo go)
//
// It starts the servers itself (clients/testbed: lockd signing tokens, PostgreSQL behind
// fence-proxy), so build them first: cargo build --workspace --bins.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	lockd "lockd.dev/client"
	"lockd.dev/client/fence"
)

const (
	resource = "inventory/sku-1"
	key      = "sku-1"
	upsert   = "INSERT INTO conformance VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
)

func write(ctx context.Context, dsn string, lock fence.Fenced, value string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return fence.Tx(ctx, conn, lock, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, upsert, key, value)
		return err
	})
}

func zombie(endpoint, dsn string) int {
	ctx := context.Background()
	client, err := lockd.Dial([]string{endpoint}, lockd.WithHolder("zombie"))
	if err != nil {
		fmt.Println("zombie:", err)
		return 2
	}
	lock, err := client.Acquire(ctx, resource, lockd.AcquireOptions{TTL: 2 * time.Second})
	if err != nil {
		fmt.Println("zombie:", err)
		return 2
	}
	fmt.Printf("zombie: holds %s with token %d; writes, then is paused (SIGSTOP)\n", resource, lock.Token())
	if err := write(ctx, dsn, lock, fmt.Sprintf("zombie (token %d)", lock.Token())); err != nil {
		fmt.Println("zombie: first write:", err)
		return 2
	}
	// A GC pause, swap, a debugger: the process stops.
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	fmt.Printf("zombie: woke up; writes anyway with token %d\n", lock.Token())
	err = write(ctx, dsn, lock, fmt.Sprintf("zombie, late (token %d)", lock.Token()))
	if errors.Is(err, lockd.ErrStaleToken) {
		fmt.Println("zombie: refused:", err)
		return 0
	}
	fmt.Println("zombie: THE STALE WRITE WAS ACCEPTED:", err)
	return 1
}

func main() {
	if len(os.Args) == 4 && os.Args[1] == "--zombie" {
		os.Exit(zombie(os.Args[2], os.Args[3]))
	}
	os.Exit(run())
}

func run() int {
	_, file, _, _ := runtime.Caller(0)
	testbed := os.Getenv("LOCKD_TESTBED")
	if testbed == "" {
		testbed = filepath.Join(filepath.Dir(file), "../../../../target/debug/testbed")
	}
	if _, err := os.Stat(testbed); err != nil {
		fmt.Fprintf(os.Stderr, "%s is missing: build it with cargo build --workspace --bins\n", testbed)
		return 2
	}
	bed := exec.Command(testbed)
	stdin, _ := bed.StdinPipe()
	stdout, _ := bed.StdoutPipe()
	if err := bed.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "starting the test bed:", err)
		return 2
	}
	defer func() { _ = stdin.Close(); _ = bed.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, "the test bed said nothing:", err)
		return 2
	}
	var servers struct {
		Lockd struct{ Endpoint string } `json:"lockd"`
		Pg    struct{ Dsn string }      `json:"pg"`
	}
	if err := json.Unmarshal([]byte(line), &servers); err != nil {
		fmt.Fprintln(os.Stderr, "the test bed's description:", err)
		return 2
	}
	endpoint, dsn := servers.Lockd.Endpoint, servers.Pg.Dsn
	self, _ := os.Executable()
	child := exec.Command(self, "--zombie", endpoint, dsn)
	child.Stdout, child.Stderr = os.Stdout, os.Stderr
	if err := child.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "starting the zombie:", err)
		return 2
	}
	// Until the zombie has stopped itself.
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(child.Process.Pid, &ws, syscall.WUNTRACED, nil); err != nil || !ws.Stopped() {
		fmt.Fprintln(os.Stderr, "the zombie exited before it was paused")
		return 1
	}
	ctx := context.Background()
	client, err := lockd.Dial([]string{endpoint}, lockd.WithHolder("newer"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	lock, err := client.Acquire(ctx, resource, lockd.AcquireOptions{TTL: 30 * time.Second, Wait: 30 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "newer:", err)
		return 1
	}
	fmt.Printf("newer:  granted %s with token %d once the zombie's lease ran out; writes\n", resource, lock.Token())
	if err := write(ctx, dsn, lock, fmt.Sprintf("newer (token %d)", lock.Token())); err != nil {
		fmt.Fprintln(os.Stderr, "newer:", err)
		return 1
	}
	_ = syscall.Kill(child.Process.Pid, syscall.SIGCONT)
	zombieErr := child.Wait()
	_, _ = lock.Release(ctx)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close(ctx)
	var value string
	if err := conn.QueryRow(ctx, "SELECT v FROM conformance WHERE k = $1", key).Scan(&value); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("the row holds: %q\n", value)
	if zombieErr == nil && strings.HasPrefix(value, "newer") {
		fmt.Println("fencing held: the zombie's write was refused")
		return 0
	}
	fmt.Println("FENCING FAILED")
	return 1
}
