#!/usr/bin/env bash
# Regenerates the Go code of Oasis's declarations of Nomad's plugin protocol
# (internal/nomadplugin/proto). Needs protoc (Debian: protobuf-compiler) and
# the two Go plugins at the versions the generated files name:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
# The generated files are committed; `make proto` runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=github.com/oasis-llm/oasis
mapfile -t files < <(find internal/nomadplugin/proto -name '*.proto' | sort)
protoc -I . -I /usr/include \
	--go_out=. --go_opt=module=$mod \
	--go-grpc_out=. --go-grpc_opt=module=$mod \
	"${files[@]}"
