// Command nomad-driver-llm is the Nomad task driver "llm". Nomad starts it
// from its plugin_dir; the same binary re-executes itself as
// "nomad-driver-llm executor ..." to supervise each engine (Nomad's shared
// executor registers that mode in an init function), so main must not
// touch os.Args or stdout before plugins.Serve.
package main

import (
	"context"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"

	"github.com/oasis-llm/oasis/nomad-driver/driver"
)

func main() {
	plugins.Serve(func(logger hclog.Logger) interface{} {
		return driver.New(context.Background(), logger)
	})
}
