package lockd

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStubsUpToDate regenerates the gRPC stubs into a temporary directory with generate.sh and
// fails when the checked-in ones (internal/lockpb) differ: run ./generate.sh after changing
// lock.proto, or after changing a generator's version.
func TestStubsUpToDate(t *testing.T) {
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env GOPATH: %v", err)
	}
	path := os.Getenv("PATH") + string(os.PathListSeparator) + filepath.Join(strings.TrimSpace(string(gopath)), "bin")
	for tool, install := range map[string]string{
		"protoc":             "install protoc 3.21.12 (e.g. apt-get install protobuf-compiler)",
		"protoc-gen-go":      "go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12",
		"protoc-gen-go-grpc": "go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1",
	} {
		if !onPath(tool, path) {
			t.Fatalf("%s is not on PATH (nor in $(go env GOPATH)/bin), so the stubs cannot be checked: %s", tool, install)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("sh", "generate.sh", out)
	cmd.Env = append(os.Environ(), "PATH="+path)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("./generate.sh failed: %v\n%s", err, b)
	}
	generated, _ := filepath.Glob(filepath.Join(out, "*.go"))
	checkedIn, _ := filepath.Glob(filepath.Join("internal", "lockpb", "*.pb.go"))
	if len(generated) == 0 || len(generated) != len(checkedIn) {
		t.Fatalf("generate.sh made %d files, internal/lockpb holds %d: run ./generate.sh", len(generated), len(checkedIn))
	}
	for _, g := range generated {
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join("internal", "lockpb", filepath.Base(g))
		have, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("%s: %v: run ./generate.sh", name, err)
		}
		if !bytes.Equal(want, have) {
			t.Errorf("%s differs from what generate.sh makes now (lock.proto or a generator changed): run ./generate.sh", name)
		}
	}
}

func onPath(tool, path string) bool {
	for _, dir := range filepath.SplitList(path) {
		if info, err := os.Stat(filepath.Join(dir, tool)); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return true
		}
	}
	return false
}
