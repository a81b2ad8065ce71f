// Command oasis-stack is `make up` / `make down` (see package localstack).
//
//	oasis-stack up [-dcs N] [-mesh] [-tracing] [-engine E]
//	                                             # N > 1: N federated datacenters, their routers
//	                                             # federated too (make up DCS=N);
//	                                             # -mesh: in the Consul service mesh (make up MESH=1);
//	                                             # -tracing: a Jaeger and the router's traces (make up TRACING=1);
//	                                             # -engine llama-cpp: real llama-server engines (make up ENGINE=llama-cpp)
//	               [-autoscale]                  # -autoscale: the Nomad Autoscaler on the recipes' scaling
//	                                             # policies (make up AUTOSCALE=1)
//	oasis-stack down
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oasis-llm/oasis/test/e2e/localstack"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		fmt.Fprintln(os.Stderr, "usage: oasis-stack up [-dcs N] [-mesh] [-tracing] [-engine sim|llama-cpp] [-autoscale] | down")
		os.Exit(2)
	}
	flags := flag.NewFlagSet("oasis-stack "+os.Args[1], flag.ExitOnError)
	dcs := flags.Int("dcs", 1, "datacenters to start (up only); more than one makes a federation")
	mesh := flags.Bool("mesh", false, "run the stack in the Consul service mesh (up only; one datacenter)")
	tracing := flags.Bool("tracing", false, "run a Jaeger all-in-one and export the router's traces to it (up only; one datacenter)")
	engine := flags.String("engine", localstack.EngineSim, "the demo recipe's engine: sim (oasis-sim) or llama-cpp (real llama-server engines on CPU; up only; one datacenter)")
	autoscale := flags.Bool("autoscale", false, "run the Nomad Autoscaler on the demo recipe's scaling policy (up only; one datacenter)")
	flags.Parse(os.Args[2:])
	root, err := testbed.RepoRoot()
	if err == nil {
		home := filepath.Join(root, ".oasis")
		switch os.Args[1] {
		case "up":
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			switch {
			case *dcs > 1 && *mesh:
				err = fmt.Errorf("-mesh runs one datacenter; the two-datacenter stack has no mesh yet")
			case *dcs > 1 && *tracing:
				err = fmt.Errorf("-tracing runs one datacenter")
			case *dcs > 1 && *engine != localstack.EngineSim:
				err = fmt.Errorf("-engine %s runs one datacenter", *engine)
			case *dcs > 1 && *autoscale:
				err = fmt.Errorf("-autoscale runs one datacenter")
			case *dcs > 1:
				_, err = localstack.UpFederation(ctx, root, home, *dcs, os.Stdout)
			default:
				_, err = localstack.Up(ctx, root, home, os.Stdout, localstack.Options{Mesh: *mesh, Tracing: *tracing, Engine: *engine, Autoscale: *autoscale})
			}
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
