// Command nomad-driver-llm is the Nomad task driver "llm". Nomad starts it
// from its plugin_dir; the same binary re-executes itself in supervisor mode
// (package nomad-driver/supervisor) to run each engine, which main hands to
// supervisor.Main before anything else.
//
// "nomad-driver-llm validate JOB.hcl..." is the pre-flight check Nomad's
// servers cannot do: it parses each job through the Nomad agent at
// NOMAD_ADDR (or -address) and validates and renders every llm task, printing
// the argv or the error naming the field.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/oasis-llm/oasis/nomad-driver/driver"
	"github.com/oasis-llm/oasis/nomad-driver/jobcheck"
	"github.com/oasis-llm/oasis/nomad-driver/supervisor"
	"github.com/oasis-llm/oasis/nomad-driver/tiers"
)

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func main() {
	if supervisor.Main() {
		return // supervisor mode runs and exits inside Main
	}
	if len(os.Args) > 1 && os.Args[1] == "validate" {
		os.Exit(validate(os.Args[2:], os.Stdout, os.Stderr))
	}
	logger := base.NewServeLogger()
	drivers.Serve(driver.New(context.Background(), logger), logger)
}

// validate returns 0 when every llm task of every job renders, 1 when one
// does not, 2 on usage or I/O errors.
func validate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	address := fs.String("address", "", "Nomad HTTP address (default: $NOMAD_ADDR or http://127.0.0.1:4646)")
	// The clients' plugin policy (see nomad-driver/README.md): the defaults
	// are those of a plugin block that sets none of these options.
	allowTaskBinary := fs.Bool("allow-task-binary", false, "the clients' plugin config sets allow_task_binary = true")
	allowedEnv := fs.String("allowed-env", "", "the clients' plugin config allowed_env, comma-separated")
	defaultUser := fs.String("default-user", config.DefaultUser, "the clients' plugin config default_user")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: nomad-driver-llm validate [-address URL] [-allow-task-binary] [-allowed-env A,B] [-default-user U] JOB.hcl...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	policy := config.PluginConfig{AllowTaskBinary: *allowTaskBinary, DefaultUser: *defaultUser}
	for _, n := range strings.Split(*allowedEnv, ",") {
		if n = strings.TrimSpace(n); n != "" {
			policy.AllowedEnv = append(policy.AllowedEnv, n)
		}
	}
	cfg := nomadapi.DefaultConfig()
	if *address != "" {
		cfg.Address = *address
	}
	client, err := nomadapi.NewClient(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "creating Nomad client: %v\n", err)
		return 2
	}
	code := 0
	for _, path := range fs.Args() {
		src, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "reading job: %v\n", err)
			return 2
		}
		job, err := client.Jobs().ParseHCL(string(src), true)
		if err != nil {
			fmt.Fprintf(stderr, "%s: parsing job: %v\n", path, err)
			return 2
		}
		// Tiers are read with this command's token (NOMAD_TOKEN); their
		// secrets are not: the driver reads those with the task's identity.
		tierSrc := tiers.Nomad{Client: client, Namespace: deref(job.Namespace)}
		results := jobcheck.CheckWith(context.Background(), job, jobcheck.Options{Policy: policy.Policy(), Tiers: tierSrc})
		if len(results) == 0 {
			fmt.Fprintf(stdout, "%s: no llm tasks\n", path)
		}
		for _, r := range results {
			fmt.Fprintf(stdout, "%s: %s\n", path, r)
			if r.Err != nil {
				code = 1
			}
		}
	}
	return code
}
