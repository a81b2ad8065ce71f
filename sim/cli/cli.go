// Package cli parses oasis-sim's command line, shaped like `vllm serve`, and runs the
// server.
//
//	oasis-sim serve MODEL [--flag value | --flag=value]...
//	oasis-sim --version
//
// Every flag Oasis's Nomad driver renders for vLLM is accepted. Flags oasis-sim does
// not model are accepted and logged once; a malformed value for any flag it knows is an
// error naming the flag.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/sim/engine"
	"github.com/oasis-llm/oasis/sim/server"
)

// Version is oasis-sim's version; `oasis-sim --version` prints "oasis-sim <Version>".
var Version = "0.1.0"

// Options is a parsed `serve` command line.
type Options struct {
	Model            string
	Host             string
	Port             int
	ServedModelNames []string
	// LoRAModules are vLLM's --lora-modules: adapters served by name.
	LoRAModules []server.LoRAModule
	// RuntimeLoRA is VLLM_ALLOW_RUNTIME_LORA_UPDATING: adapters may be
	// loaded and unloaded at run time.
	RuntimeLoRA bool
	MaxModelLen int // 0: derived
	Speed       float64
	Seed        uint64
	Engine      engine.Config
	Power       engine.PowerModel
	KVEvents    *kvevents.PublisherConfig
	KVTransfer  json.RawMessage
	// PD is the disaggregated prefill/decode setup: --kv-transfer-config's engine_id
	// and kv_load_failure_policy, SGLang's --disaggregation-mode, the KV link flags
	// and, from the environment (FromEnv), vLLM's NIXL side channel.
	PD server.PDConfig
	// BootstrapPort is SGLang's --disaggregation-bootstrap-port (default 8998, as
	// SGLang): a prefill-mode sim serves its side channel there.
	BootstrapPort int
	APIKey        string
	LogLevel      string
	// Ignored lists accepted flags that oasis-sim does not model, with their values.
	Ignored []string

	gpuUtil      float64
	kvLayout     kvevents.Layout
	offloadBytes float64 // CPU offloading capacity from --kv-offloading-size or an OffloadingConnector
}

// kind is how a flag's value is parsed.
type kind int

const (
	kString kind = iota
	kInt
	kFloat
	kBool
	kJSON
	kList
	kDuration
)

type flagSpec struct {
	kind kind
	// modelled flags set opts; the rest are validated and reported as ignored.
	set func(o *Options, v string) error
}

// vLLM boolean flags that take no value, so the next argument is not swallowed.
var vllmBools = map[string]bool{
	"trust-remote-code": true, "enforce-eager": true, "disable-log-requests": true, "enable-log-requests": true,
	"disable-log-stats": true, "enable-chunked-prefill": true, "enable-lora": true, "disable-custom-all-reduce": true,
	"enable-auto-tool-choice": true, "enable-prompt-tokens-details": true, "enable-request-id-headers": true,
	"disable-frontend-multiprocessing": true, "async-scheduling": true, "disable-fastapi-docs": true,
	"enable-sleep-mode": true, "headless": true, "enable-expert-parallel": true, "skip-tokenizer-init": true,
	"disable-uvicorn-access-log": true, "enable-server-load-tracking": true, "return-tokens-as-token-ids": true,
	"disable-sliding-window": true, "enable-force-include-usage": true, "enable-log-outputs": true,
}

func specs() map[string]flagSpec {
	return map[string]flagSpec{
		"model": {kString, func(o *Options, v string) error { o.Model = v; return nil }},
		// vLLM's --api-key: /v1 endpoints then require "Authorization: Bearer KEY".
		"api-key": {kString, func(o *Options, v string) error { o.APIKey = v; return nil }},
		"host":    {kString, func(o *Options, v string) error { o.Host = v; return nil }},
		"port": {kInt, func(o *Options, v string) error {
			n, err := atoiRange(v, 0, 65535)
			o.Port = n
			return err
		}},
		"served-model-name": {kList, nil}, // handled by the parser (one or more values)
		"lora-modules":      {kList, nil}, // name=path or vLLM's JSON form, one or more
		"max-model-len": {kString, func(o *Options, v string) error {
			n, err := parseHumanInt(v)
			if err == nil && n < 1 {
				err = errors.New("must be positive")
			}
			o.MaxModelLen = n
			return err
		}},
		"block-size": {kInt, func(o *Options, v string) error {
			n, err := atoiRange(v, 1, 1<<20)
			o.Engine.BlockSize = n
			return err
		}},
		"num-gpu-blocks":          {kInt, setNumBlocks},
		"num-gpu-blocks-override": {kInt, setNumBlocks},
		"max-num-seqs": {kInt, func(o *Options, v string) error {
			n, err := atoiRange(v, 1, 1<<30)
			o.Engine.MaxNumSeqs = n
			return err
		}},
		"max-num-batched-tokens": {kInt, func(o *Options, v string) error {
			n, err := parseHumanInt(v)
			if err == nil && n < 1 {
				err = errors.New("must be positive")
			}
			o.Engine.MaxNumBatchedTokens = n
			return err
		}},
		"gpu-memory-utilization": {kFloat, func(o *Options, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil && (f <= 0 || f > 1) {
				err = errors.New("must be in (0, 1]")
			}
			o.gpuUtil = f
			return err
		}},
		"tensor-parallel-size":   {kInt, validatePositive},
		"tp":                     {kInt, validatePositive},
		"pipeline-parallel-size": {kInt, validatePositive},
		"data-parallel-size":     {kInt, validatePositive},
		"seed": {kInt, func(o *Options, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			o.Seed = uint64(n)
			return err
		}},
		"enable-prefix-caching": {kBool, func(o *Options, v string) error {
			b, err := strconv.ParseBool(v)
			o.Engine.DisablePrefixCaching = !b
			return err
		}},
		"kv-events-config":   {kJSON, setKVEvents},
		"kv-transfer-config": {kJSON, setKVTransfer},
		"kv-offloading-backend": {kString, func(o *Options, v string) error {
			if v != "native" && v != "lmcache" {
				return errors.New(`must be "native" or "lmcache"`)
			}
			return nil
		}},
		"kv-offloading-size": {kFloat, func(o *Options, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil && f < 0 {
				err = errors.New("must not be negative")
			}
			o.offloadBytes = f * (1 << 30)
			return err
		}},
		"speed": {kFloat, func(o *Options, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil && f < 0 {
				err = errors.New("must not be negative")
			}
			o.Speed = f
			return err
		}},
		"kv-link-gbps": {kFloat, func(o *Options, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil && f <= 0 {
				err = errors.New("must be positive")
			}
			o.PD.LinkBytesPerSec = f * 1e9 / 8
			return err
		}},
		"kv-bytes-per-token": {kInt, func(o *Options, v string) error {
			n, err := atoiRange(v, 1, 1<<30)
			o.PD.BytesPerToken = n
			return err
		}},
		"kv-hold-timeout": {kDuration, func(o *Options, v string) error { return setPositiveDur(&o.PD.HoldTimeout, v) }},
		"kv-wait-timeout": {kDuration, func(o *Options, v string) error { return setPositiveDur(&o.PD.WaitTimeout, v) }},
		// SGLang's disaggregation flags (python/sglang/srt/server_args.py).
		"disaggregation-mode": {kString, func(o *Options, v string) error {
			switch v {
			case "null":
				o.PD.SGLangMode = ""
			case server.ModePrefill, server.ModeDecode:
				o.PD.SGLangMode = v
			default:
				return errors.New(`must be "null", "prefill" or "decode"`)
			}
			return nil
		}},
		"disaggregation-bootstrap-port": {kInt, func(o *Options, v string) error {
			n, err := atoiRange(v, 1, 65535)
			o.BootstrapPort = n
			return err
		}},
		"disaggregation-transfer-backend": {kString, nil},
		"disaggregation-ib-device":        {kString, nil},
		"step-time-base":                  {kDuration, func(o *Options, v string) error { return setDur(&o.Engine.Timing.StepBase, v) }},
		"step-time-per-prefill-token":     {kDuration, func(o *Options, v string) error { return setDur(&o.Engine.Timing.PerPrefillToken, v) }},
		"step-time-per-decode-seq":        {kDuration, func(o *Options, v string) error { return setDur(&o.Engine.Timing.PerDecodeSeq, v) }},
		"step-time-per-loaded-token":      {kDuration, func(o *Options, v string) error { return setDur(&o.Engine.Timing.PerLoadedToken, v) }},
		"power-idle-watts":                {kFloat, func(o *Options, v string) error { return setNonNeg(&o.Power.IdleWatts, v) }},
		"power-watts-per-util":            {kFloat, func(o *Options, v string) error { return setNonNeg(&o.Power.WattsPerUtil, v) }},
		"kv-events-layout": {kString, func(o *Options, v string) error {
			switch v {
			case "map":
				o.kvLayout = kvevents.LayoutMap
			case "array":
				o.kvLayout = kvevents.LayoutArray
			default:
				return errors.New(`must be "map" or "array"`)
			}
			return nil
		}},
		"log-level": {kString, func(o *Options, v string) error {
			if hclog.LevelFromString(v) == hclog.NoLevel {
				return errors.New("must be trace, debug, info, warn or error")
			}
			o.LogLevel = v
			return nil
		}},
		// Accepted, validated, not modelled.
		"dtype": {kString, nil}, "tokenizer": {kString, nil}, "revision": {kString, nil},
		"quantization": {kString, nil}, "max-logprobs": {kInt, nil}, "swap-space": {kFloat, nil},
		"cpu-offload-gb": {kFloat, nil}, "download-dir": {kString, nil}, "load-format": {kString, nil},
		"uvicorn-log-level": {kString, nil}, "chat-template": {kString, nil}, "generation-config": {kString, nil},
		"kv-cache-dtype": {kString, nil}, "distributed-executor-backend": {kString, nil},
		"data-parallel-rank": {kInt, nil}, "data-parallel-address": {kString, nil}, "data-parallel-rpc-port": {kInt, nil},
		"compilation-config": {kJSON, nil}, "speculative-config": {kJSON, nil}, "override-generation-config": {kJSON, nil},
		"limit-mm-per-prompt": {kJSON, nil}, "hf-overrides": {kJSON, nil},
		"prefix-caching-hash-algo": {kString, nil}, // the sim's block hashes are its own chain
	}
}

func (o *Options) ignore(name, v string) {
	// Values of anything that looks like a credential are never logged.
	for _, w := range []string{"key", "token", "secret", "password", "credential"} {
		if strings.Contains(name, w) && v != "" {
			v = "<redacted>"
		}
	}
	o.Ignored = append(o.Ignored, "--"+name+" "+v)
}

func validatePositive(o *Options, v string) error {
	_, err := atoiRange(v, 1, 1<<20)
	return err
}

func setNumBlocks(o *Options, v string) error {
	n, err := atoiRange(v, 1, 1<<31-1)
	o.Engine.NumGPUBlocks = n
	return err
}

func setDur(d *time.Duration, v string) error {
	x, err := time.ParseDuration(v)
	if err == nil && x < 0 {
		err = errors.New("must not be negative")
	}
	*d = x
	return err
}

func setPositiveDur(d *time.Duration, v string) error {
	if err := setDur(d, v); err != nil {
		return err
	}
	if *d <= 0 {
		return errors.New("must be positive")
	}
	return nil
}

func setNonNeg(f *float64, v string) error {
	x, err := strconv.ParseFloat(v, 64)
	if err == nil && x < 0 {
		err = errors.New("must not be negative")
	}
	*f = x
	return err
}

func atoiRange(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errors.New("not an integer")
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("must be between %d and %d", lo, hi)
	}
	return n, nil
}

// parseHumanInt accepts vLLM's human-readable sizes: 2048, 32k, 32K (1024), 1m, 1M.
func parseHumanInt(v string) (int, error) {
	mult := 1
	s := v
	switch {
	case strings.HasSuffix(v, "k"):
		mult, s = 1000, v[:len(v)-1]
	case strings.HasSuffix(v, "K"):
		mult, s = 1024, v[:len(v)-1]
	case strings.HasSuffix(v, "m"):
		mult, s = 1000000, v[:len(v)-1]
	case strings.HasSuffix(v, "M"):
		mult, s = 1<<20, v[:len(v)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, errors.New("not an integer")
	}
	return n * mult, nil
}

// kvEventsConfig is vLLM's KVEventsConfig.
type kvEventsConfig struct {
	EnableKVCacheEvents bool    `json:"enable_kv_cache_events"`
	Publisher           string  `json:"publisher"`
	Endpoint            string  `json:"endpoint"`
	ReplayEndpoint      *string `json:"replay_endpoint"`
	BufferSteps         int     `json:"buffer_steps"`
	HWM                 int     `json:"hwm"`
	MaxQueueSize        int     `json:"max_queue_size"`
	Topic               string  `json:"topic"`
}

// kvConnector is the part of vLLM's KVTransferConfig oasis-sim reads.
type kvConnector struct {
	KVConnector         string `json:"kv_connector"`
	EngineID            string `json:"engine_id"`
	KVLoadFailurePolicy string `json:"kv_load_failure_policy"`
	Extra               struct {
		CPUBytesToUse float64       `json:"cpu_bytes_to_use"`
		Connectors    []kvConnector `json:"connectors"`
	} `json:"kv_connector_extra_config"`
}

// setKVTransfer records the connector config; an OffloadingConnector (alone or inside
// a MultiConnector) sizes the simulated CPU tier from cpu_bytes_to_use.
func setKVTransfer(o *Options, v string) error {
	var c kvConnector
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		return fmt.Errorf("not a KV transfer config object: %w", err)
	}
	o.KVTransfer = json.RawMessage(v)
	o.PD.EngineID = c.EngineID
	switch c.KVLoadFailurePolicy {
	case "", server.PolicyFail, server.PolicyRecompute:
		o.PD.LoadFailurePolicy = c.KVLoadFailurePolicy
	default:
		return fmt.Errorf("kv_load_failure_policy %q: must be %q or %q", c.KVLoadFailurePolicy, server.PolicyRecompute, server.PolicyFail)
	}
	var walk func(c kvConnector)
	walk = func(c kvConnector) {
		if c.KVConnector == "OffloadingConnector" && c.Extra.CPUBytesToUse > 0 {
			o.offloadBytes = c.Extra.CPUBytesToUse
		}
		for _, sub := range c.Extra.Connectors {
			walk(sub)
		}
	}
	walk(c)
	return nil
}

func setKVEvents(o *Options, v string) error {
	// vLLM defaults to tcp://*:5557 (all interfaces); Oasis binds loopback unless told.
	c := kvEventsConfig{Publisher: "null", Endpoint: "tcp://127.0.0.1:5557"}
	dec := json.NewDecoder(strings.NewReader(v))
	if err := dec.Decode(&c); err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	if !c.EnableKVCacheEvents {
		o.KVEvents = nil
		return nil
	}
	switch c.Publisher {
	case "zmq":
	case "null", "":
		// vLLM enables events with the null publisher: nothing leaves the process.
		o.KVEvents = nil
		return nil
	default:
		return fmt.Errorf("publisher %q: oasis-sim supports \"zmq\" and \"null\"", c.Publisher)
	}
	if !strings.HasPrefix(c.Endpoint, "tcp://") {
		return fmt.Errorf("endpoint %q: oasis-sim binds tcp:// endpoints only", c.Endpoint)
	}
	pc := &kvevents.PublisherConfig{Endpoint: c.Endpoint, Topic: c.Topic, BufferSize: c.BufferSteps}
	if c.ReplayEndpoint != nil {
		pc.ReplayEndpoint = *c.ReplayEndpoint
	}
	o.KVEvents = pc
	return nil
}

// Parse parses the arguments after "serve".
func Parse(args []string) (*Options, error) {
	o := &Options{Host: "127.0.0.1", Port: 8000, Speed: 1, LogLevel: "info", gpuUtil: 0.9, Power: engine.DefaultPower(), BootstrapPort: 8998}
	o.Engine.Timing = engine.DefaultTiming() // the step-time flags override single terms
	sp := specs()
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		name := strings.TrimLeft(a, "-")
		value, hasValue := "", false
		if k := strings.IndexByte(name, '='); k >= 0 {
			name, value, hasValue = name[:k], name[k+1:], true
		}
		name = strings.ReplaceAll(name, "_", "-")
		if name == "" {
			return nil, fmt.Errorf("invalid argument %q", a)
		}
		spec, known := sp[name]
		negated := false
		if !known && strings.HasPrefix(name, "no-") {
			if s2, ok := sp[strings.TrimPrefix(name, "no-")]; ok && s2.kind == kBool {
				spec, known, negated = s2, true, true
				name = strings.TrimPrefix(name, "no-")
			}
		}
		next := func() (string, bool) {
			if hasValue {
				return value, true
			}
			if i+1 < len(args) && (!strings.HasPrefix(args[i+1], "-") || looksNumeric(args[i+1])) {
				i++
				return args[i], true
			}
			return "", false
		}
		if !known {
			// Unknown flag: a vLLM boolean or --no-x takes no value; otherwise the next
			// non-flag argument is its value.
			v := ""
			if !vllmBools[name] && !strings.HasPrefix(name, "no-") {
				v, _ = next()
			} else if hasValue {
				v = value
			}
			o.ignore(name, v)
			continue
		}
		switch spec.kind {
		case kBool:
			v := "true"
			if hasValue {
				v = value
			}
			if negated {
				b, err := strconv.ParseBool(v)
				if err != nil {
					return nil, fmt.Errorf("invalid value for --no-%s: %q", name, v)
				}
				v = strconv.FormatBool(!b)
			}
			if err := spec.set(o, v); err != nil {
				return nil, fmt.Errorf("invalid value for --%s: %q: %v", name, v, err)
			}
		case kList:
			var vals []string
			if hasValue {
				vals = append(vals, value)
			} else {
				for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
					i++
					vals = append(vals, args[i])
				}
			}
			if len(vals) == 0 {
				return nil, fmt.Errorf("flag --%s needs at least one value", name)
			}
			if name == "lora-modules" {
				if err := o.addLoRAModules(vals); err != nil {
					return nil, fmt.Errorf("invalid value for --lora-modules: %v", err)
				}
				continue
			}
			o.ServedModelNames = vals
		default:
			v, ok := next()
			if !ok {
				return nil, fmt.Errorf("flag --%s needs a value", name)
			}
			if spec.kind == kJSON && !json.Valid([]byte(v)) {
				return nil, fmt.Errorf("invalid value for --%s: not valid JSON: %q", name, v)
			}
			if spec.set == nil {
				if err := checkKind(spec.kind, v); err != nil {
					return nil, fmt.Errorf("invalid value for --%s: %q: %v", name, v, err)
				}
				o.ignore(name, v)
				continue
			}
			if err := spec.set(o, v); err != nil {
				return nil, fmt.Errorf("invalid value for --%s: %q: %v", name, v, err)
			}
			if notModelled[name] {
				o.ignore(name, v)
			}
		}
	}
	switch {
	case len(positional) > 1:
		return nil, fmt.Errorf("unexpected arguments %q (want exactly one MODEL)", positional[1:])
	case len(positional) == 1 && o.Model != "" && o.Model != positional[0]:
		return nil, fmt.Errorf("MODEL %q and --model %q disagree", positional[0], o.Model)
	case len(positional) == 1:
		o.Model = positional[0]
	}
	if o.Model == "" {
		return nil, errors.New("MODEL is required: oasis-sim serve MODEL [flags]")
	}
	bs := o.Engine.BlockSize
	if bs == 0 {
		bs = engine.DefaultConfig().BlockSize
	}
	if o.offloadBytes > 0 {
		// Llama-3-8B BF16: 128 KiB of KV per token, as on the GPU side.
		o.Engine.CPUBlocks = int(o.offloadBytes / float64(128*1024*bs))
	}
	if o.Engine.NumGPUBlocks == 0 {
		o.Engine.NumGPUBlocks = engine.BlocksForMemory(o.gpuUtil, bs)
		if o.Engine.NumGPUBlocks < 1 {
			return nil, fmt.Errorf("invalid value for --gpu-memory-utilization: %v leaves no memory for the KV cache (give --num-gpu-blocks)", o.gpuUtil)
		}
	}
	if o.KVEvents != nil {
		o.KVEvents.Layout = o.kvLayout
	}
	return o, nil
}

// FromEnv reads VLLM_ALLOW_RUNTIME_LORA_UPDATING and vLLM's NIXL side-channel settings, VLLM_NIXL_SIDE_CHANNEL_HOST
// (default: --host) and VLLM_NIXL_SIDE_CHANNEL_PORT (default 5600, as vLLM's
// vllm/envs.py): with a --kv-transfer-config the sim serves its side channel there.
func (o *Options) FromEnv(getenv func(string) string) error {
	// vLLM's envs.py: "1" or "true", any case.
	rt := strings.ToLower(getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
	o.RuntimeLoRA = rt == "1" || rt == "true"
	o.PD.SideChannelHost = getenv("VLLM_NIXL_SIDE_CHANNEL_HOST")
	o.PD.SideChannelPort = 5600
	if v := getenv("VLLM_NIXL_SIDE_CHANNEL_PORT"); v != "" {
		n, err := atoiRange(v, 1, 65535)
		if err != nil {
			return fmt.Errorf("invalid VLLM_NIXL_SIDE_CHANNEL_PORT %q: %w", v, err)
		}
		o.PD.SideChannelPort = n
	}
	return nil
}

// notModelled are flags that are parsed and validated but change nothing.
var notModelled = map[string]bool{
	"tensor-parallel-size": true, "tp": true, "pipeline-parallel-size": true, "data-parallel-size": true,
}

func looksNumeric(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

func checkKind(k kind, v string) error {
	switch k {
	case kInt:
		if _, err := strconv.Atoi(v); err != nil {
			return errors.New("not an integer")
		}
	case kFloat:
		if _, err := strconv.ParseFloat(v, 64); err != nil {
			return errors.New("not a number")
		}
	}
	return nil
}

// Main runs oasis-sim with os.Args[1:]-style arguments and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	switch args[0] {
	case "--version", "-v", "version":
		fmt.Fprintf(stdout, "oasis-sim %s\n", Version)
		return 0
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	case "serve":
	default:
		fmt.Fprintf(stderr, "unknown command %q\n%s\n", args[0], usage)
		return 2
	}
	for _, a := range args[1:] {
		if a == "--version" {
			fmt.Fprintf(stdout, "oasis-sim %s\n", Version)
			return 0
		}
		if a == "-h" || a == "--help" {
			fmt.Fprintln(stdout, usage)
			return 0
		}
	}
	o, err := Parse(args[1:])
	if err == nil {
		err = o.FromEnv(os.Getenv)
	}
	if err != nil {
		fmt.Fprintf(stderr, "oasis-sim: %v\n", err)
		return 2
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "oasis-sim", Level: hclog.LevelFromString(o.LogLevel), Output: stderr})
	if err := Serve(ctx, o, log, nil); err != nil {
		log.Error("exiting", "error", err)
		return 1
	}
	return 0
}

// Serve runs the server until ctx ends or SIGINT/SIGTERM. If ready is non-nil it
// receives the bound API address once listening.
func Serve(ctx context.Context, o *Options, log hclog.Logger, ready chan<- net.Addr) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	seen := map[string]bool{}
	for _, ig := range o.Ignored {
		name, _, _ := strings.Cut(ig, " ")
		if !seen[name] {
			seen[name] = true
			log.Info("flag accepted but not modelled by oasis-sim", "flag", ig)
		}
	}
	bs := o.Engine.BlockSize
	if bs == 0 {
		bs = engine.DefaultConfig().BlockSize
	}
	capacity := o.Engine.NumGPUBlocks * bs
	maxLen := o.MaxModelLen
	if maxLen == 0 {
		maxLen = min(131072, capacity)
	} else if maxLen > capacity {
		return fmt.Errorf("max model len %d is larger than the KV cache (%d tokens in %d blocks): raise --num-gpu-blocks or lower --max-model-len",
			maxLen, capacity, o.Engine.NumGPUBlocks)
	}
	sideLn, err := listenSideChannel(o)
	if err != nil {
		return err
	}
	if sideLn != nil {
		defer sideLn.Close()
	}
	cfg := server.Config{
		Model: o.Model, ServedModelNames: o.ServedModelNames, LoRAModules: o.LoRAModules, RuntimeLoRA: o.RuntimeLoRA, MaxModelLen: maxLen, Speed: o.Speed, Seed: o.Seed,
		Engine: o.Engine, Power: o.Power, KVEvents: o.KVEvents, KVTransfer: len(o.KVTransfer) > 0,
		Host: o.Host, Version: Version, Logger: log, APIKey: o.APIKey, PD: o.PD,
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	if sideLn != nil {
		side := &http.Server{Handler: srv.SideChannel(), ReadHeaderTimeout: 30 * time.Second}
		go func() { _ = side.Serve(sideLn) }()
		defer side.Close()
		log.Info("serving the KV side channel", "addr", sideLn.Addr().String())
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(o.Host, strconv.Itoa(o.Port)))
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second}
	go srv.Run(ctx)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	attrs := []any{"addr", ln.Addr().String(), "model", o.Model, "served", cfg.ServedModelNames, "speed", o.Speed,
		"block_size", o.Engine.BlockSize, "num_gpu_blocks", o.Engine.NumGPUBlocks, "max_model_len", maxLen}
	if a := srv.KVEventsAddr(); a != nil {
		attrs = append(attrs, "kv_events", a.String())
	}
	log.Info("serving", attrs...)
	if ready != nil {
		ready <- ln.Addr()
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	return nil
}

// listenSideChannel binds the KV side channel: vLLM's NIXL side channel when a
// --kv-transfer-config is set, SGLang's bootstrap port in --disaggregation-mode
// prefill; nil otherwise. It records the bound port in o.PD.SideChannelPort.
func listenSideChannel(o *Options) (net.Listener, error) {
	var host string
	var port int
	switch {
	case o.PD.SGLangMode == server.ModePrefill:
		host, port = o.Host, o.BootstrapPort
	case o.PD.SGLangMode == "" && len(o.KVTransfer) > 0:
		host, port = o.PD.SideChannelHost, o.PD.SideChannelPort
		if host == "" {
			host = o.Host
		}
	default:
		return nil, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listening on the KV side channel: %w", err)
	}
	o.PD.SideChannelPort = ln.Addr().(*net.TCPAddr).Port
	return ln, nil
}

const usage = `usage: oasis-sim serve MODEL [flags]     (flags as vllm serve; see sim/README.md)
       oasis-sim --version`

// addLoRAModules reads --lora-modules values: name=path, or vLLM's JSON
// form {"name": ..., "path": ..., "base_model_name": ...}.
func (o *Options) addLoRAModules(vals []string) error {
	for _, v := range vals {
		var m server.LoRAModule
		if strings.HasPrefix(v, "{") {
			var j struct{ Name, Path string }
			if err := json.Unmarshal([]byte(v), &j); err != nil {
				return fmt.Errorf("%q: %v", v, err)
			}
			m = server.LoRAModule{Name: j.Name, Path: j.Path}
		} else {
			name, path, _ := strings.Cut(v, "=")
			m = server.LoRAModule{Name: name, Path: path}
		}
		if m.Name == "" || m.Path == "" {
			return fmt.Errorf("%q: want name=path", v)
		}
		o.LoRAModules = append(o.LoRAModules, m)
	}
	return nil
}
