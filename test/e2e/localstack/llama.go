package localstack

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/oasis-llm/oasis/internal/tinymodel"
)

// prepareLlama puts what `make up ENGINE=llama-cpp` serves under home/llama, where the llm
// driver's engine user reaches it: a copy of bin/llama-server (scripts/hashistack.sh
// llama-server builds it) and the tiny random-weight Llama model oasis-tinymodel writes from
// bin/llama.cpp's vocabulary. It returns both paths.
func prepareLlama(root, home string, out io.Writer) (server, model string, err error) {
	bin, err := filepath.EvalSymlinks(filepath.Join(root, "bin", "llama-server"))
	if err != nil {
		return "", "", fmt.Errorf("ENGINE=llama-cpp needs bin/llama-server (make up builds it with scripts/hashistack.sh llama-server): %w", err)
	}
	src, err := filepath.EvalSymlinks(filepath.Join(root, "bin", "llama.cpp"))
	if err != nil {
		return "", "", fmt.Errorf("ENGINE=llama-cpp needs bin/llama.cpp, the source tree llama-server was built from: %w", err)
	}
	dir := filepath.Join(home, "llama")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	// MkdirAll keeps an existing home's mode: the engines' user must traverse both.
	for _, d := range []string{home, dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return "", "", err
		}
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", "", err
	}
	server = filepath.Join(dir, "llama-server")
	if err := os.WriteFile(server, data, 0o755); err != nil {
		return "", "", err
	}
	model = filepath.Join(dir, "tiny.gguf")
	start := time.Now()
	if err := tinymodel.WriteFile(model, src, tinymodel.Options{Seed: 1}); err != nil {
		return "", "", fmt.Errorf("making the tiny model: %w", err)
	}
	if err := os.Chmod(model, 0o644); err != nil {
		return "", "", err
	}
	fmt.Fprintf(out, "  made the tiny llama.cpp model %s in %s\n", model, time.Since(start).Round(time.Millisecond))
	return server, model, nil
}
