// Command licensecheck checks the licences of every module in the Go module
// graph of the module in the working directory (`go list -m all`), reading
// each module's own licence files; it exits 1 naming each module whose
// licence Oasis may not link. With -notice it also writes the third-party
// licence listing of the modules linked into the packages given as
// arguments (make dist puts it in every tarball).
//
//	go run ./internal/licenses/cmd/licensecheck [-notice FILE PKG...]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"

	"github.com/oasis-llm/oasis/internal/licenses"
)

func main() {
	notice := flag.String("notice", "", "write the third-party licence listing of the modules linked into the package arguments to this file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *notice, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "licensecheck:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, notice string, pkgs []string) error {
	mods, err := licenses.Check(ctx, ".")
	if err != nil && !errors.Is(err, licenses.ErrRefused) {
		return err
	}
	counts := map[string]int{}
	for _, m := range mods {
		counts[kinds(m)]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, counts[k])
	}
	fmt.Printf("licensecheck: %d modules in the graph: %s\n", len(mods), strings.Join(parts, ", "))
	for _, m := range mods {
		if m.Problem == "" && len(m.Kinds) == 0 {
			fmt.Printf("licensecheck: %s has no recognised licence; only its go.mod is in the graph (no package of it is built)\n", m.ID())
		}
	}
	if err != nil {
		return err
	}
	if notice == "" {
		return nil
	}
	if len(pkgs) == 0 {
		return errors.New("-notice needs the packages whose linked modules it lists")
	}
	linked, err := licenses.Linked(ctx, ".", pkgs...)
	if err != nil {
		return err
	}
	f, err := os.Create(notice)
	if err != nil {
		return err
	}
	if err := licenses.WriteNotice(f, mods, func(m licenses.Module) bool { return linked[m.Path] }); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func kinds(m licenses.Module) string {
	if m.Problem != "" {
		return "refused"
	}
	if len(m.Kinds) == 0 {
		return "unrecognised but not linked"
	}
	s := make([]string, len(m.Kinds))
	for i, k := range m.Kinds {
		s[i] = string(k)
	}
	return strings.Join(s, "+")
}
