// Command oasis-stack is `make up` / `make down` (see package localstack).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oasis-llm/oasis/test/e2e/localstack"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		fmt.Fprintln(os.Stderr, "usage: oasis-stack up|down")
		os.Exit(2)
	}
	root, err := testbed.RepoRoot()
	if err == nil {
		home := filepath.Join(root, ".oasis")
		switch os.Args[1] {
		case "up":
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			_, err = localstack.Up(ctx, root, home, os.Stdout)
			cancel()
		case "down":
			err = localstack.Down(home, os.Stdout)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "oasis-stack: %v\n", err)
		os.Exit(1)
	}
}
