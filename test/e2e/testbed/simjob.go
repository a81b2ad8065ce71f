package testbed

import (
	"fmt"
	"strings"
)

// SimEngine is one oasis-sim engine job as the e2e tests run it: driver llm, engine sim, the
// oasis-engine service with the meta convention of ARCHITECTURE.md and a 1 s health check, and no
// restarts or reschedules, so a failure shows at once.
type SimEngine struct {
	ID string // job id
	// Model is the served model name (oasis_model); default "llama".
	Model string
	// Provider is the service provider, "consul" (default) or "nomad".
	Provider string
	// KVEvents publishes KV events on a port labelled "kv", advertised in oasis_kv_events.
	KVEvents bool
	// KVEventsReplay (with KVEvents) serves their replay buffer on a port labelled "kv_replay",
	// advertised in oasis_kv_events_replay.
	KVEventsReplay bool
	// Tags are added to the service's oasis tags.
	Tags []string
	// Config holds extra lines for the task's config block.
	Config string
	// Task holds extra blocks for the task (a template, for instance).
	Task string
}

// HCL renders the jobspec.
func (e SimEngine) HCL() string { return e.render(groupNet{}) }

// groupNet is what a network mode changes in the engine's group: MeshSimEngine fills it.
type groupNet struct {
	mode    string // network mode line; empty for the default (host)
	httpTo  int    // the "to" of port http; 0 for none
	connect string // the service's connect block
	check   string // replaces the service's HTTP check
}

func (e SimEngine) render(g groupNet) string {
	model, provider := e.Model, e.Provider
	if model == "" {
		model = "llama"
	}
	if provider == "" {
		provider = "consul"
	}
	ports, kvMeta, kvConfig := `port "http" {}`, `""`, "kv_events         = false"
	if g.httpTo > 0 {
		ports = fmt.Sprintf(`port "http" { to = %d }`, g.httpTo)
	}
	if g.mode != "" {
		ports = g.mode + "\n      " + ports
	}
	check := `check {
        type     = "http"
        path     = "/health"
        interval = "1s"
        timeout  = "1s"
      }`
	if g.check != "" {
		check = g.check
	}
	replayMeta := ""
	if e.KVEvents {
		ports += "\n      port \"kv\" {}"
		kvMeta, kvConfig = `"tcp://${NOMAD_ADDR_kv}"`, `kv_events_port    = "kv"`
		if e.KVEventsReplay {
			ports += "\n      port \"kv_replay\" {}"
			kvConfig += "\n        kv_events_replay_port = \"kv_replay\""
			replayMeta = "\n        oasis_kv_events_replay = \"tcp://${NOMAD_ADDR_kv_replay}\""
		}
	}
	tags := []string{`"oasis"`, `"engine-sim"`, `"role-both"`}
	for _, t := range e.Tags {
		tags = append(tags, fmt.Sprintf("%q", t))
	}
	return fmt.Sprintf(`
job %[1]q {
  datacenters = ["*"]
  type        = "service"

  group "engine" {
    network {
      %[2]s
    }

    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }

    service {
      name     = "oasis-engine"
      provider = %[3]q
      port     = "http"
      tags     = [%[4]s]
      meta {
        oasis_model        = %[5]q
        oasis_engine       = "sim"
        oasis_role         = "both"
        oasis_kv_events    = %[6]s%[9]s
        oasis_metrics_path = "/metrics"
        oasis_block_size   = "16"
        oasis_node         = "${node.unique.id}"
      }
      %[11]s
      %[12]s
    }

    task "engine" {
      driver       = "llm"
      kill_signal  = "SIGTERM"
      kill_timeout = "5s"
      config {
        engine            = "sim"
        model             = "meta-llama/Llama-3.1-8B-Instruct"
        served_model_name = %[5]q
        port              = "http"
        %[7]s
        %[8]s
      }
      resources {
        cpu    = 200
        memory = 256
      }
      %[10]s
    }
  }
}
`, e.ID, ports, provider, strings.Join(tags, ", "), model, kvMeta, kvConfig, e.Config, replayMeta, e.Task, check, g.connect)
}
