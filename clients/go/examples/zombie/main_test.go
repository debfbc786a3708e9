package main

import (
	"os"
	"testing"
)

// TestMain lets the test binary play the zombie too: run() starts os.Executable() with
// --zombie, which is this binary under `go test`.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "--zombie" {
		os.Exit(zombie(os.Args[2], os.Args[3]))
	}
	os.Exit(m.Run())
}

// The demo runs, and fencing holds in it: the zombie's own process is paused for real, a
// newer holder writes, the zombie's late write is refused as stale.
func TestTheZombieDemo(t *testing.T) {
	if code := run(); code != 0 {
		t.Fatalf("the zombie demo exited %d (its output is above)", code)
	}
}
