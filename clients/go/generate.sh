#!/bin/sh
# Regenerates the gRPC stubs of internal/lockpb from lockd's proto (the contract).
# Needs /usr/bin/protoc (3.21.12) and, on PATH (or in $(go env GOPATH)/bin):
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
# Usage: ./generate.sh [OUTPUT_DIR]   (default: internal/lockpb)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-"$here/internal/lockpb"}
proto="$here/../../lockd/lockd-proto/proto"
PATH="$PATH:$(go env GOPATH)/bin"
export PATH
mkdir -p "$out"
m=Mfencing/lock/v1/lock.proto=lockd.dev/client/internal/lockpb
protoc -I "$proto" \
	--go_out="$out" --go_opt=paths=source_relative --go_opt="$m" \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative --go-grpc_opt="$m" \
	fencing/lock/v1/lock.proto
# paths=source_relative writes under fencing/lock/v1/: move the files up.
mv "$out"/fencing/lock/v1/*.go "$out"/
rm -r "$out/fencing"
