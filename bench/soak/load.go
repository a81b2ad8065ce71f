package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/redis/go-redis/v9"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// outcomes counts requests by kind and what became of them.
type outcomes struct {
	mu sync.Mutex
	n  map[string]int64 // "kind/cause"
}

func (o *outcomes) add(kind, cause string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[kind+"/"+cause]++
}

// soak drives the load and the sampler until the duration passes.
func soak(ctx context.Context, s *testbed.Stack, t targets, o options) *report {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	rep := &report{Duration: o.duration.String(), Workers: o.workers}
	out := &outcomes{n: map[string]int64{}}
	var wg sync.WaitGroup
	kv := redis.NewClient(&redis.Options{Addr: t.kvcachedAddr, Password: t.kvcachedPass, PoolSize: o.workers})
	defer kv.Close()
	for i := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: time.Minute}
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				one(ctx, client, kv, t, rng, out)
			}
		}()
	}
	if o.restartEvery > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); restartEngines(ctx, s, o.restartEvery, out) }()
	}
	rep.Samples = sampleUntil(ctx, t, o.sample)
	wg.Wait()
	rep.Outcomes = out.n
	return rep
}

// one sends one request of a kind drawn at random.
func one(ctx context.Context, c *http.Client, kv *redis.Client, t targets, rng *rand.Rand, out *outcomes) {
	switch p := rng.IntN(100); {
	case p < 40:
		out.add("stream", stream(ctx, c, t, rng, false))
	case p < 60:
		out.add("whole", whole(ctx, c, t, rng))
	case p < 70:
		out.add("cancel", stream(ctx, c, t, rng, true))
	case p < 80:
		out.add("bad_input", badInput(ctx, c, t, rng))
	default:
		out.add("kvcached", kvRoundTrip(ctx, kv, rng))
	}
}

func chatBody(t targets, rng *rand.Rand, stream bool) string {
	// A shared system prompt and a varying question: prefix routing has
	// something to find, and every prompt is distinct.
	return fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":%d,"messages":[{"role":"system","content":"You are the soak test's assistant; answer briefly."},{"role":"user","content":"question %d"}]}`,
		t.model, stream, 4+rng.IntN(28), rng.IntN(1<<20))
}

// stream sends a streaming chat request and reads it to [DONE]; with
// cancel it hangs up after the first event instead.
func stream(ctx context.Context, c *http.Client, t targets, rng *rand.Rand, cancel bool) string {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	resp, cause := post(rctx, c, t.routerURL+"/v1/chat/completions", chatBody(t, rng, true))
	if resp == nil {
		return cause
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cancel && strings.HasPrefix(line, "data: {"):
			return "cancelled"
		case strings.HasPrefix(line, `data: {"error"`):
			var e struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &e)
			return "error_event:" + e.Error.Code
		case line == "data: [DONE]":
			return "ok"
		}
	}
	if sc.Err() != nil {
		return transportCause(ctx, sc.Err())
	}
	return "lost" // a clean end without [DONE] or an error: a silent cut
}

// whole sends a completion without streaming.
func whole(ctx context.Context, c *http.Client, t targets, rng *rand.Rand) string {
	body := fmt.Sprintf(`{"model":%q,"prompt":"soak %d","max_tokens":%d}`, t.model, rng.IntN(1<<20), 4+rng.IntN(28))
	resp, cause := post(ctx, c, t.routerURL+"/v1/completions", body)
	if resp == nil {
		return cause
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return transportCause(ctx, err)
	}
	var v struct {
		Choices []json.RawMessage `json:"choices"`
	}
	if json.Unmarshal(b, &v) != nil || len(v.Choices) == 0 {
		return "lost" // a 200 whose body is no whole answer
	}
	return "ok"
}

// badInput sends a request the router must refuse with an OpenAI error.
func badInput(ctx context.Context, c *http.Client, t targets, rng *rand.Rand) string {
	cases := []struct{ path, body, deadline string }{
		{"/v1/chat/completions", `{"model":`, ""},
		{"/v1/chat/completions", `["not","an","object"]`, ""},
		{"/v1/chat/completions", `{"model":"no-such-model","messages":[]}`, ""},
		{"/v1/chat/completions", `{"messages":[]}`, ""},
		{"/v1/completions", `{"model":"` + t.model + `","prompt":"x"}`, "soon"},
		{"/v1/nope", `{}`, ""},
	}
	tc := cases[rng.IntN(len(cases))]
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, t.routerURL+tc.path, strings.NewReader(tc.body))
	req.Header.Set("Content-Type", "application/json")
	if tc.deadline != "" {
		req.Header.Set("X-Oasis-Deadline-Ms", tc.deadline)
	}
	resp, err := c.Do(req)
	if err != nil {
		return transportCause(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 && resp.StatusCode < 500 && errorCode(resp) != "" {
		return "rejected"
	}
	return fmt.Sprintf("unexpected:%d", resp.StatusCode)
}

// kvRoundTrip stores a value in kvcached and reads it back.
func kvRoundTrip(ctx context.Context, kv *redis.Client, rng *rand.Rand) string {
	key := fmt.Sprintf("soak-%d", rng.IntN(512))
	val := bytes.Repeat([]byte{byte(rng.IntN(256))}, 1<<(10+rng.IntN(8))) // 1 KiB .. 128 KiB
	if err := kv.Set(ctx, key, val, 0).Err(); err != nil {
		return transportCause(ctx, err)
	}
	got, err := kv.Get(ctx, key).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return "evicted" // another client's SET replaced it, or the tiers evicted it
	case err != nil:
		return transportCause(ctx, err)
	case len(got) > 0 && !bytes.Equal(got, bytes.Repeat(got[:1], len(got))):
		return "corrupt" // each value is one byte repeated; a mix is a corrupt block
	}
	return "ok"
}

// post sends a JSON body and returns a 200 response, or no response and
// what became of the request (an error the router answered, or one on the
// wire).
func post(ctx context.Context, c *http.Client, url, body string) (*http.Response, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, transportCause(ctx, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, "error:" + errorCode(resp)
	}
	return resp, ""
}

func errorCode(resp *http.Response) string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &e) != nil || e.Error.Code == "" {
		return fmt.Sprintf("status_%d_not_openai_shape", resp.StatusCode)
	}
	return e.Error.Code
}

// transportCause names an error the client saw on the wire (a refused or
// cut connection, a timeout); the soak's own end is not one.
func transportCause(ctx context.Context, err error) string {
	switch {
	case ctx.Err() != nil:
		return "stopped"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, io.ErrUnexpectedEOF):
		return "cut_or_timeout"
	}
	return "transport_error"
}

// restartEngines restarts one engine allocation every interval, in turn.
func restartEngines(ctx context.Context, s *testbed.Stack, every time.Duration, out *outcomes) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		allocs, _, err := s.Nomad.Allocations().List(&nomadapi.QueryOptions{})
		if err != nil {
			out.add("engine_restart", "list_failed")
			continue
		}
		var engines []*nomadapi.AllocationListStub
		for _, a := range allocs {
			if a.ClientStatus == "running" && a.JobID != "oasis-router" && a.JobID != "oasis-kvcached" {
				engines = append(engines, a)
			}
		}
		if len(engines) == 0 {
			out.add("engine_restart", "none_running")
			continue
		}
		a := engines[n%len(engines)]
		if err := s.Nomad.Allocations().Restart(&nomadapi.Allocation{ID: a.ID}, "", nil); err != nil {
			out.add("engine_restart", "failed")
			continue
		}
		out.add("engine_restart", "ok")
	}
}
