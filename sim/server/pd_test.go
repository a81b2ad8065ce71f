package server

import (
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// pdServer is one engine of a disaggregated pair with its side channel.
type pdServer struct {
	s    *Server
	url  string
	side *httptest.Server
}

func startPD(t *testing.T, mod func(*Config)) *pdServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	s, url := startServer(t, func(c *Config) {
		c.KVTransfer = true
		c.Host = "127.0.0.1"
		c.PD.SideChannelPort = port
		if mod != nil {
			mod(c)
		}
	})
	side := httptest.NewUnstartedServer(s.SideChannel())
	side.Listener.Close()
	side.Listener = ln
	side.Start()
	t.Cleanup(side.Close)
	return &pdServer{s: s, url: url, side: side}
}

func prefillLeg(prompt string) map[string]any {
	return map[string]any{"prompt": prompt, "max_tokens": 1, "stream": false, "kv_transfer_params": map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}}
}

func decodeLeg(prompt string, kv map[string]any) map[string]any {
	return map[string]any{"prompt": prompt, "max_tokens": 4, "kv_transfer_params": kv}
}

var pdPrompt = strings.Repeat("a long prompt that the prefill engine computes ", 20)

func runPrefill(t *testing.T, p *pdServer, prompt string) (map[string]any, int) {
	t.Helper()
	code, body := post(t, p.url+"/v1/completions", prefillLeg(prompt))
	must.Eq(t, 200, code, must.Sprintf("%s", body))
	r := decode[completionResp](t, body)
	must.Eq(t, 1, r.Usage.CompletionTokens)
	return r.KVTransferParams, r.Usage.PromptTokens
}

func TestVLLMPullMovesKV(t *testing.T) {
	p := startPD(t, func(c *Config) { c.PD.EngineID = "prefill-0" })
	d := startPD(t, nil)
	kv, n := runPrefill(t, p, pdPrompt)
	blocks := (n + 15) / 16
	must.Eq(t, true, kv["do_remote_prefill"])
	must.Eq(t, false, kv["do_remote_decode"])
	must.Eq(t, "prefill-0", kv["remote_engine_id"])
	must.Eq(t, "127.0.0.1", kv["remote_host"])
	must.Eq(t, float64(p.side.Listener.Addr().(*net.TCPAddr).Port), kv["remote_port"].(float64))
	must.Len(t, blocks, kv["remote_block_ids"].([]any))
	must.StrHasPrefix(t, "cmpl-", kv["remote_request_id"].(string))
	must.Eq(t, float64(blocks), value(t, scrape(t, p.url), "oasis_sim_kv_held_blocks"))

	code, body := post(t, d.url+"/v1/completions", decodeLeg(pdPrompt, kv))
	must.Eq(t, 200, code, must.Sprintf("%s", body))
	must.Eq(t, 4, decode[completionResp](t, body).Usage.CompletionTokens)
	dm, pm := scrape(t, d.url), scrape(t, p.url)
	must.Eq(t, float64(n), metricWithLabel(t, dm, "oasis_sim_prompt_tokens_total", "source", "remote"))
	must.Eq(t, 0, metricWithLabel(t, dm, "oasis_sim_prompt_tokens_total", "source", "local"))
	must.Eq(t, float64(blocks), metricWithLabel(t, dm, "oasis_sim_kv_transfer_blocks_total", "direction", "received"))
	must.Eq(t, 1, value(t, dm, "oasis_sim_kv_transfer_seconds"))
	must.Eq(t, float64(blocks), metricWithLabel(t, pm, "oasis_sim_kv_transfer_blocks_total", "direction", "sent"))
	must.Eq(t, 0, value(t, pm, "oasis_sim_kv_held_blocks"))
	must.Eq(t, float64(n), metricWithLabel(t, pm, "oasis_sim_prompt_tokens_total", "source", "local"))

	// Pulled once: a second decode leg with the same params finds nothing and, under
	// vLLM's default kv_load_failure_policy "fail", fails.
	code, body = post(t, d.url+"/v1/completions", decodeLeg(pdPrompt, kv))
	must.Eq(t, 500, code, must.Sprintf("%s", body))
	must.StrContains(t, string(body), "not_found")
	must.Eq(t, 1, metricWithLabel(t, scrape(t, d.url), "oasis_sim_kv_transfer_failures_total", "reason", "not_found"))
}

func TestVLLMPrefillGone(t *testing.T) {
	p := startPD(t, nil)
	recompute := startPD(t, func(c *Config) { c.PD.LoadFailurePolicy = PolicyRecompute })
	failing := startPD(t, nil)
	kv, n := runPrefill(t, p, pdPrompt)
	p.side.Close() // the prefill engine is gone

	code, body := post(t, recompute.url+"/v1/completions", decodeLeg(pdPrompt, kv))
	must.Eq(t, 200, code, must.Sprintf("%s", body))
	m := scrape(t, recompute.url)
	must.Eq(t, float64(n), metricWithLabel(t, m, "oasis_sim_prompt_tokens_total", "source", "local"))
	must.Eq(t, 0, metricWithLabel(t, m, "oasis_sim_prompt_tokens_total", "source", "remote"))
	must.Eq(t, 1, metricWithLabel(t, m, "oasis_sim_kv_transfer_failures_total", "reason", "unreachable"))

	code, body = post(t, failing.url+"/v1/completions", decodeLeg(pdPrompt, kv))
	must.Eq(t, 500, code, must.Sprintf("%s", body))
	must.StrContains(t, string(body), "unreachable")
}

func TestVLLMPromptMismatch(t *testing.T) {
	p := startPD(t, nil)
	d := startPD(t, func(c *Config) { c.PD.LoadFailurePolicy = PolicyRecompute })
	kv, _ := runPrefill(t, p, pdPrompt)
	code, _ := post(t, d.url+"/v1/completions", decodeLeg("another prompt", kv))
	must.Eq(t, 200, code)
	must.Eq(t, 1, metricWithLabel(t, scrape(t, d.url), "oasis_sim_kv_transfer_failures_total", "reason", "mismatch"))
	// The prefill engine still holds the KV for the right decode leg.
	code, _ = post(t, d.url+"/v1/completions", decodeLeg(pdPrompt, kv))
	must.Eq(t, 200, code)
	must.Eq(t, 0, value(t, scrape(t, p.url), "oasis_sim_kv_held_blocks"))
}

func TestVLLMHeldKVExpires(t *testing.T) {
	p := startPD(t, func(c *Config) { c.PD.HoldTimeout = 20 * time.Millisecond })
	runPrefill(t, p, pdPrompt)
	testutil.Eventually(t, 5*time.Second, "the held KV to expire", func() bool {
		return metricWithLabel(t, scrape(t, p.url), "oasis_sim_kv_transfer_failures_total", "reason", "expired") == 1
	})
	must.Eq(t, 0, value(t, scrape(t, p.url), "oasis_sim_kv_held_blocks"))
}

func TestKVTransferParamsMalformed(t *testing.T) {
	p := startPD(t, nil)
	good := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "e",
		"remote_request_id": "r", "remote_host": "127.0.0.1", "remote_port": 1, "remote_block_ids": []int{1, 2}}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for a, b := range good {
			m[a] = b
		}
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		kv    any
		param string
	}{
		{"not an object", "kv_transfer_params"},
		{[]int{1}, "kv_transfer_params"},
		{map[string]any{"do_remote_decode": "yes"}, "kv_transfer_params.do_remote_decode"},
		{map[string]any{"do_remote_decode": true, "do_remote_prefill": true}, "kv_transfer_params"},
		{with("remote_port", "8000"), "kv_transfer_params.remote_port"},
		{with("remote_port", 70000), "kv_transfer_params.remote_port"},
		{with("remote_host", nil), "kv_transfer_params.remote_host"},
		{with("remote_engine_id", 3), "kv_transfer_params.remote_engine_id"},
		{with("remote_request_id", ""), "kv_transfer_params.remote_request_id"},
		{with("remote_block_ids", nil), "kv_transfer_params.remote_block_ids"},
		{with("remote_block_ids", []any{1, -2}), "kv_transfer_params.remote_block_ids"},
		{with("remote_block_ids", []any{1.5}), "kv_transfer_params.remote_block_ids"},
		{with("remote_block_ids", "1,2"), "kv_transfer_params.remote_block_ids"},
	} {
		code, body := post(t, p.url+"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 2, "kv_transfer_params": tc.kv})
		must.Eq(t, 400, code, must.Sprintf("%v: %s", tc.kv, body))
		e := decode[struct {
			Error struct {
				Param any `json:"param"`
				Type  string
			} `json:"error"`
		}](t, body)
		must.Eq(t, any(tc.param), e.Error.Param, must.Sprintf("%v", tc.kv))
	}
}

// The transfer time is blocks × block size × bytes per token / link bandwidth.
func TestKVTransferTimeScales(t *testing.T) {
	for _, tc := range []struct {
		words int
		bw    float64
	}{{10, 50e9}, {40, 50e9}, {40, 5e9}} {
		p := startPD(t, nil)
		d := startPD(t, func(c *Config) { c.PD.LinkBytesPerSec = tc.bw })
		prompt := strings.Repeat("word ", tc.words)
		kv, n := runPrefill(t, p, prompt)
		code, _ := post(t, d.url+"/v1/completions", decodeLeg(prompt, kv))
		must.Eq(t, 200, code)
		h := scrape(t, d.url)["oasis_sim_kv_transfer_seconds"].GetMetric()[0].GetHistogram()
		want := float64((n+15)/16*16*131072) / tc.bw
		must.Between(t, want*0.999, h.GetSampleSum(), want*1.001)
	}
}

// At --speed 1 the decode leg really waits the transfer time.
func TestKVTransferWaitsAtSpeed(t *testing.T) {
	// 1 MiB per token (the prefill engine reports its model's KV size) over 1 GB/s:
	// a 1-block prompt takes ~17 ms.
	p := startPD(t, func(c *Config) { c.PD.BytesPerToken = 1 << 20 })
	d := startPD(t, func(c *Config) { c.Speed = 1; c.PD.LinkBytesPerSec = 1e9 })
	prompt := strings.Repeat("word ", 12)
	kv, n := runPrefill(t, p, prompt)
	start := time.Now()
	code, _ := post(t, d.url+"/v1/completions", decodeLeg(prompt, kv))
	must.Eq(t, 200, code)
	want := time.Duration(float64(((n+15)/16*16)<<20) / 1e9 * float64(time.Second))
	must.Greater(t, want, time.Since(start))
	h := scrape(t, d.url)["oasis_sim_kv_transfer_seconds"].GetMetric()[0].GetHistogram()
	must.Eq(t, want.Seconds(), h.GetSampleSum())
}

func sidePort(p *pdServer) int { return p.side.Listener.Addr().(*net.TCPAddr).Port }

// sglangLeg is the request SGLang's load balancer sends to both engines.
func sglangLeg(prompt string, port int, room int64) map[string]any {
	return map[string]any{"prompt": prompt, "max_tokens": 4, "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room}
}

func startSGLang(t *testing.T, mode string, mod func(*Config)) *pdServer {
	return startPD(t, func(c *Config) {
		c.KVTransfer = false
		c.PD.SGLangMode = mode
		if mod != nil {
			mod(c)
		}
	})
}

func TestSGLangLegsInEitherOrder(t *testing.T) {
	p := startSGLang(t, ModePrefill, nil)
	d := startSGLang(t, ModeDecode, nil)
	n := 0
	for i, decodeFirst := range []bool{true, false} {
		room := int64(1<<62 + i) // beyond float64's exact integers
		leg := sglangLeg(pdPrompt, sidePort(p), room)
		var wg sync.WaitGroup
		var code int
		var body []byte
		wg.Add(1)
		runDecode := func() { defer wg.Done(); code, body = post(t, d.url+"/v1/completions", leg) }
		if decodeFirst {
			go runDecode()
			// A head start for the decode leg: the order is the input (were
			// it to lose the race, this case would test the other order).
			time.Sleep(50 * time.Millisecond)
		}
		pc, pb := post(t, p.url+"/v1/completions", leg)
		must.Eq(t, 200, pc, must.Sprintf("%s", pb))
		pr := decode[completionResp](t, pb)
		must.Eq(t, 1, pr.Usage.CompletionTokens) // the prefill engine emits the first token only
		must.Nil(t, pr.KVTransferParams)
		n = pr.Usage.PromptTokens
		if !decodeFirst {
			runDecode()
		}
		wg.Wait()
		must.Eq(t, 200, code, must.Sprintf("%s", body))
		must.Eq(t, 4, decode[completionResp](t, body).Usage.CompletionTokens)
	}
	dm := scrape(t, d.url)
	must.Eq(t, float64(2*n), metricWithLabel(t, dm, "oasis_sim_prompt_tokens_total", "source", "remote"))
	must.Eq(t, 0, metricWithLabel(t, dm, "oasis_sim_prompt_tokens_total", "source", "local"))
	must.Eq(t, 0, value(t, scrape(t, p.url), "oasis_sim_kv_held_blocks"))
}

func TestSGLangDecodeFails(t *testing.T) {
	p := startSGLang(t, ModePrefill, nil)
	d := startSGLang(t, ModeDecode, func(c *Config) { c.PD.WaitTimeout = 100 * time.Millisecond })
	// The room never comes: SGLang's decode aborts the request with an error.
	code, body := post(t, d.url+"/v1/completions", sglangLeg(pdPrompt, sidePort(p), 7))
	must.Eq(t, 500, code, must.Sprintf("%s", body))
	must.StrContains(t, string(body), "not_found")
	// The prefill engine is gone.
	port := sidePort(p)
	p.side.Close()
	code, body = post(t, d.url+"/v1/completions", sglangLeg(pdPrompt, port, 8))
	must.Eq(t, 500, code, must.Sprintf("%s", body))
	m := scrape(t, d.url)
	must.Eq(t, 1, metricWithLabel(t, m, "oasis_sim_kv_transfer_failures_total", "reason", "unreachable"))
	must.Eq(t, 1, metricWithLabel(t, m, "oasis_sim_kv_transfer_failures_total", "reason", "not_found"))
}

func TestSGLangFieldsMalformed(t *testing.T) {
	d := startSGLang(t, ModeDecode, nil)
	for _, tc := range []struct {
		field string
		v     any
	}{
		{"bootstrap_room", "x"}, {"bootstrap_room", -1}, {"bootstrap_room", 1.5}, {"bootstrap_room", nil},
		{"bootstrap_port", "8998"}, {"bootstrap_port", 0}, {"bootstrap_host", 1}, {"bootstrap_host", ""},
	} {
		leg := sglangLeg("hi", 1, 1)
		leg[tc.field] = tc.v
		code, body := post(t, d.url+"/v1/completions", leg)
		must.Eq(t, 400, code, must.Sprintf("%v: %s", tc, body))
		must.StrContains(t, string(body), `"param":"`+tc.field+`"`)
	}
}

// Without a --kv-transfer-config the sim ignores kv_transfer_params, as vLLM does.
func TestKVTransferParamsIgnoredWithoutConnector(t *testing.T) {
	s, url := startServer(t, nil)
	code, body := post(t, url+"/v1/completions", prefillLeg(pdPrompt))
	must.Eq(t, 200, code)
	must.Nil(t, decode[completionResp](t, body).KVTransferParams)
	must.Eq(t, 0, s.eng.Stats().HeldBlocks)
	kv := map[string]any{"do_remote_prefill": true, "remote_engine_id": "e", "remote_request_id": "r",
		"remote_host": "127.0.0.1", "remote_port": 1, "remote_block_ids": []int{1}}
	code, _ = post(t, url+"/v1/completions", decodeLeg(pdPrompt, kv))
	must.Eq(t, 200, code)
}

// Of two decode legs pulling the same KV at once, one gets it.
func TestConcurrentPullsTakeOnce(t *testing.T) {
	p := startPD(t, nil)
	d := startPD(t, nil)
	kv, _ := runPrefill(t, p, pdPrompt)
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _ = post(t, d.url+"/v1/completions", decodeLeg(pdPrompt, kv))
		}()
	}
	wg.Wait()
	ok := 0
	for _, c := range codes {
		if c == 200 {
			ok++
		}
	}
	must.Eq(t, 1, ok, must.Sprintf("codes %v", codes))
}
