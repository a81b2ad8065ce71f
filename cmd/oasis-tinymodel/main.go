// Command oasis-tinymodel writes a tiny Llama-architecture GGUF model with seeded random
// weights, Llama 3's tokenizer and Llama 3.1's chat template, taken from llama.cpp's
// source tree (bin/llama.cpp, linked by scripts/hashistack.sh llama-server), for
// llama-server to serve in tests and in `make up ENGINE=llama-cpp`:
//
//	oasis-tinymodel -o tiny.gguf [-src bin/llama.cpp] [-layers 4] [-seed 1]
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/oasis-llm/oasis/internal/tinymodel"
)

func main() {
	out := flag.String("o", "", "the GGUF file to write (required)")
	src := flag.String("src", "bin/llama.cpp", "llama.cpp's source tree (its models/ directory)")
	var o tinymodel.Options
	flag.IntVar(&o.Layers, "layers", 4, "transformer blocks")
	flag.IntVar(&o.Embd, "embd", 64, "hidden size")
	flag.IntVar(&o.Heads, "heads", 4, "attention heads")
	flag.IntVar(&o.KVHeads, "kv-heads", 2, "KV heads")
	flag.IntVar(&o.FF, "ff", 128, "feed-forward size")
	flag.IntVar(&o.Context, "ctx", 4096, "context length")
	flag.Uint64Var(&o.Seed, "seed", 1, "seed of the random weights")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	start := time.Now()
	if err := tinymodel.WriteFile(*out, *src, o); err != nil {
		fmt.Fprintln(os.Stderr, "oasis-tinymodel:", err)
		os.Exit(1)
	}
	st, err := os.Stat(*out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "oasis-tinymodel:", err)
		os.Exit(1)
	}
	fmt.Printf("oasis-tinymodel: wrote %s (%.1f MB) in %s\n", *out, float64(st.Size())/1e6, time.Since(start).Round(time.Millisecond))
}
