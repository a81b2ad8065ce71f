// Command oasis-autoscaler-strategy is the Oasis strategy plugin for the
// Nomad Autoscaler ("oasis-sizing", autoscaler/strategy): engines from a
// model's arrival rate, the per-engine capacity within the TTFT SLO and a
// headroom (autoscaler/sizing). Put it in the autoscaler's plugin_dir and
// declare it in the agent config:
//
//	strategy "oasis-sizing" {
//	  driver = "oasis-autoscaler-strategy"
//	  config = { prometheus_address = "http://127.0.0.1:9090" } # for capacity = "learned"
//	}
//
// The autoscaler starts it; run by hand it only says so.
package main

import (
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad-autoscaler/plugins"

	"github.com/oasis-llm/oasis/autoscaler/strategy"
)

func main() {
	plugins.Serve(func(log hclog.Logger) interface{} {
		return strategy.New(strategy.Config{Logger: log.Named(strategy.Name)})
	})
}
