//go:build oasisdeps

// Package deps pins the modules Oasis builds on while their first users are written.
package deps

import (
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
	_ "github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	_ "github.com/cockroachdb/pebble"
	_ "github.com/go-zeromq/zmq4"
	_ "github.com/hashicorp/consul/api"
	_ "github.com/hashicorp/go-hclog"
	_ "github.com/hashicorp/go-plugin"
	_ "github.com/hashicorp/nomad/api"
	_ "github.com/hashicorp/nomad/client/lib/numalib"
	_ "github.com/hashicorp/nomad/drivers/shared/eventer"
	_ "github.com/hashicorp/nomad/drivers/shared/executor"
	_ "github.com/hashicorp/nomad/plugins"
	_ "github.com/hashicorp/nomad/plugins/base"
	_ "github.com/hashicorp/nomad/plugins/device"
	_ "github.com/hashicorp/nomad/plugins/drivers"
	_ "github.com/hashicorp/nomad/plugins/drivers/testutils"
	_ "github.com/hashicorp/nomad/plugins/shared/hclspec"
	_ "github.com/hashicorp/nomad/plugins/shared/structs"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/quic-go/quic-go"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/shoenig/test/must"
	_ "github.com/vmihailenco/msgpack/v5"
	_ "lukechampine.com/blake3"
)
