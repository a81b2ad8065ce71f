// Command oasis-sim is a vLLM-compatible engine simulator: `oasis-sim serve MODEL
// [vllm flags]` serves vLLM's OpenAI API, metrics and KV events without a GPU. See
// sim/README.md.
package main

import (
	"context"
	"os"

	"github.com/oasis-llm/oasis/sim/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
