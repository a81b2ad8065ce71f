package cluster

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// A trace library: published traces with their source and licence, and
// seeded generators of production shapes, all in the Mooncake format. A
// -trace argument is a library name ("mooncake-conversation"), a generator
// ("gen:rag", "gen:rag:docs=200,zipf=1.4") or a file.

// TraceEntry is one published trace.
type TraceEntry struct {
	Name    string
	Family  string // the shape it stands for, for cross-validation
	Path    string // relative to the repository root (the bench-routing working directory)
	Source  string
	Licence string
	Doc     string
}

// Traces are the published traces with prefix information (hash ids) the
// library holds, shipped gzipped under bench/cluster/traces/.
var Traces = []TraceEntry{
	{Name: "mooncake-conversation", Family: "conversation", Path: "bench/cluster/traces/mooncake-conversation.jsonl.gz",
		Source:  "kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl",
		Licence: "Apache-2.0",
		Doc:     "12,031 requests of one hour of Kimi chat traffic; mean input 12,035 tokens, output 343; every request starts with block 0"},
	{Name: "mooncake-synthetic", Family: "long-context", Path: "bench/cluster/traces/mooncake-synthetic.jsonl.gz",
		Source:  "kvcache-ai/Mooncake FAST25-release/traces/synthetic_trace.jsonl (commit 3b5a594)",
		Licence: "Apache-2.0",
		Doc:     "3,993 requests over 1,022 s; mean input 15,325 tokens, output 149; Mooncake's synthetic mix of long shared contexts"},
}

// Knob is one generator parameter (every knob is a number; counts round down).
type Knob struct {
	Name    string
	Default float64
	Doc     string
}

// Knobs are a generator's parameters by name.
type Knobs map[string]float64

func (k Knobs) int(name string) int { return int(k[name]) }

// Generator makes a workload of one production shape.
type Generator struct {
	Name   string
	Family string
	Doc    string
	Knobs  []Knob
	gen    func(k Knobs, rng *rand.Rand) []*Request
}

// common knobs of every generator.
var commonKnobs = []Knob{
	{"n", 20000, "requests (enough that the rates a bisection finds are sustained, not burst-bound)"},
	{"rate", 4, "mean arrivals per second (conversation, session or request starts) at scale 1"},
	{"out", 256, "output tokens per request"},
	{"seed", 1, "random seed: equal knobs and seed give the same trace"},
}

// Generators are the library's production shapes. Sizes are in 512-token
// trace blocks.
var Generators = []Generator{
	{Name: "tenants", Family: "multi-tenant", Doc: "many tenants, each with its own long system prompt, single-turn requests with a short user part",
		Knobs: []Knob{{"tenants", 64, "tenants (system prompts)"}, {"system", 8, "system prompt blocks"}, {"user", 2, "user blocks (uniform 1..user)"},
			{"zipf", 0, "Zipf exponent of tenant popularity (>1; 0 uniform)"}},
		gen: genTenants},
	{Name: "chat", Family: "conversation", Doc: "multi-turn chat: each turn's prompt is the previous prompt, its answer and a new user message",
		Knobs: []Knob{{"system", 2, "shared system prompt blocks"}, {"turns", 8, "mean turns per conversation (geometric)"},
			{"user", 1, "user blocks per turn"}, {"think", 20, "mean seconds between a conversation's turns"}, {"rate", 1, "conversation starts per second"}},
		gen: genChat},
	{Name: "rag", Family: "rag", Doc: "retrieval-augmented generation: a system prompt, k documents drawn from a pool by Zipf popularity (most relevant first), a question",
		Knobs: []Knob{{"docs", 400, "documents in the pool"}, {"docblocks", 4, "blocks per document"}, {"k", 3, "documents per request"},
			{"zipf", 1.2, "Zipf exponent of document popularity (>1)"}, {"system", 1, "system prompt blocks"}, {"question", 1, "question blocks"}},
		gen: genRAG},
	{Name: "agent", Family: "agentic", Doc: "agentic tool loops: a session opens on a long context, then many short turns each append a tool result and the model's call",
		Knobs: []Knob{{"context", 24, "initial context blocks (tools, instructions, repository)"}, {"steps", 16, "mean turns per session (geometric)"},
			{"tool", 1, "tool-result blocks per turn"}, {"think", 2, "mean seconds between turns (tool latency)"}, {"rate", 0.5, "session starts per second"},
			{"out", 96, "output tokens per turn (a tool call)"}, {"n", 5000, "requests (16-turn sessions on 12k-token contexts: 5,000 arrive over 40 s or more at the rates found)"}},
		gen: genAgent},
	{Name: "diurnal", Family: "bursty", Doc: "multi-tenant traffic whose arrival rate follows a day curve compressed to a period, with bursts",
		Knobs: []Knob{{"tenants", 32, "tenants (system prompts)"}, {"system", 6, "system prompt blocks"}, {"user", 2, "user blocks (uniform 1..user)"},
			{"period", 600, "seconds of one compressed day"}, {"amp", 0.8, "day/night swing: rate × (1 ± amp)"},
			{"burst", 4, "rate multiplier inside a burst"}, {"burstlen", 10, "seconds a burst lasts"}, {"burstevery", 120, "mean seconds between burst starts"}},
		gen: genDiurnal},
	{Name: "mixed", Family: "mixed-length", Doc: "mixed short and long prompts: short chat turns beside long documents, each behind one of a few system prompts",
		Knobs: []Knob{{"long", 0.2, "share of long prompts"}, {"short", 1, "short prompt blocks (uniform 1..short, last partial)"},
			{"longmin", 16, "long prompt blocks, minimum"}, {"longmax", 48, "long prompt blocks, maximum"}, {"groups", 8, "system prompts"}, {"system", 2, "system prompt blocks"}},
		gen: genMixed},
	{Name: "skewed", Family: "skewed-tenant", Doc: "one tenant's prefix takes a given share of the traffic, the others split the rest",
		Knobs: []Knob{{"tenants", 32, "tenants"}, {"hot", 0.5, "share of requests of tenant 0"}, {"system", 8, "system prompt blocks"}, {"user", 2, "user blocks (uniform 1..user)"}},
		gen:   genSkewed},
}

// GeneratorByName finds a generator.
func GeneratorByName(name string) (Generator, bool) {
	for _, g := range Generators {
		if g.Name == name {
			return g, true
		}
	}
	return Generator{}, false
}

// AllKnobs are a generator's knobs with the common ones its own do not override.
func (g Generator) AllKnobs() []Knob {
	out := slices.Clone(g.Knobs)
	for _, c := range commonKnobs {
		if !slices.ContainsFunc(out, func(k Knob) bool { return k.Name == c.Name }) {
			out = append(out, c)
		}
	}
	return out
}

// Generate makes the workload with the given knobs (unset ones default).
func (g Generator) Generate(set Knobs) ([]*Request, error) {
	k := Knobs{}
	for _, kn := range g.AllKnobs() {
		k[kn.Name] = kn.Default
	}
	for name, v := range set {
		if _, ok := k[name]; !ok {
			return nil, fmt.Errorf("gen:%s: unknown knob %q", g.Name, name)
		}
		if math.IsNaN(v) || v < 0 {
			return nil, fmt.Errorf("gen:%s: knob %s=%v must be a non-negative number", g.Name, name, v)
		}
		k[name] = v
	}
	if k.int("n") < 1 || k["rate"] <= 0 || k.int("out") < 1 {
		return nil, fmt.Errorf("gen:%s: n, rate and out must be positive", g.Name)
	}
	rng := rand.New(rand.NewPCG(uint64(k["seed"]), 0x11b7a7))
	reqs := g.gen(k, rng)
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Arrival < reqs[j].Arrival })
	if len(reqs) > k.int("n") {
		reqs = reqs[:k.int("n")]
	}
	return reqs, nil
}

// ParseGen reads "gen:NAME" or "gen:NAME:knob=v,knob=v".
func ParseGen(spec string) (Generator, Knobs, error) {
	rest, ok := strings.CutPrefix(spec, "gen:")
	if !ok {
		return Generator{}, nil, fmt.Errorf("%q is not a generator (gen:NAME[:knob=v,...])", spec)
	}
	name, list, _ := strings.Cut(rest, ":")
	g, ok := GeneratorByName(name)
	if !ok {
		return Generator{}, nil, fmt.Errorf("no generator %q (have %s)", name, strings.Join(GeneratorNames(), ", "))
	}
	set := Knobs{}
	if list != "" {
		for _, kv := range strings.Split(list, ",") {
			k, v, ok := strings.Cut(kv, "=")
			f, err := strconv.ParseFloat(v, 64)
			if !ok || err != nil {
				return Generator{}, nil, fmt.Errorf("gen:%s: bad knob %q (want name=number)", name, kv)
			}
			set[strings.TrimSpace(k)] = f
		}
	}
	return g, set, nil
}

// GeneratorNames lists the generators.
func GeneratorNames() []string {
	var out []string
	for _, g := range Generators {
		out = append(out, g.Name)
	}
	return out
}

// LibraryNames lists every runnable library entry: the published traces and
// each generator at its defaults.
func LibraryNames() []string {
	var out []string
	for _, t := range Traces {
		out = append(out, t.Name)
	}
	for _, g := range Generators {
		out = append(out, "gen:"+g.Name)
	}
	return out
}

// Family names the shape of a library entry (the trace's or generator's
// family), or "file" for any other trace.
func Family(spec string) string {
	for _, t := range Traces {
		if t.Name == spec {
			return t.Family
		}
	}
	if g, _, err := ParseGen(spec); err == nil {
		return g.Family
	}
	return "file"
}

// LoadSpec loads a library name, a generator spec or a trace file (JSONL,
// gzipped when it ends in .gz).
func LoadSpec(spec string) ([]*Request, error) {
	if strings.HasPrefix(spec, "gen:") {
		g, set, err := ParseGen(spec)
		if err != nil {
			return nil, err
		}
		return g.Generate(set)
	}
	for _, t := range Traces {
		if t.Name == spec {
			return LoadTrace(resolve(t.Path))
		}
	}
	return LoadTrace(spec)
}

// resolve finds a library path from the repository root or, in tests, from
// this package's directory.
func resolve(p string) string {
	if _, err := os.Stat(p); err == nil {
		return p
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return p
	}
	alt := filepath.Join(filepath.Dir(file), "..", "..", p)
	if _, err := os.Stat(alt); err == nil {
		return alt
	}
	return p
}

// ids hands out fresh hash ids.
type ids struct{ next int64 }

func (d *ids) block() int64 { d.next++; return d.next }

func (d *ids) blocks(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = d.block()
	}
	return out
}

// request builds one request from its blocks; partial trims the last block
// to a random length (at least one token) when true.
func request(at float64, blocks []int64, out int, partial bool, rng *rand.Rand) *Request {
	in := len(blocks) * TraceBlock
	if partial {
		in -= rng.IntN(TraceBlock)
	}
	return &Request{Arrival: int64(at * 1000), Input: in, Output: out, HashIDs: slices.Clone(blocks)}
}

// poisson gives successive arrival times at rate per second.
type poisson struct {
	t    float64
	rate float64
	rng  *rand.Rand
}

func (p *poisson) next() float64 { p.t += p.rng.ExpFloat64() / p.rate; return p.t }

// geometric draws a count ≥ 1 with the given mean.
func geometric(rng *rand.Rand, mean float64) int {
	if mean <= 1 {
		return 1
	}
	n := 1
	for rng.Float64() > 1/mean {
		n++
	}
	return n
}

// zipfPick draws an index in [0, n) with Zipf exponent s (> 1), else uniform.
func zipfPicker(rng *rand.Rand, s float64, n int) func() int {
	if s > 1 && n > 1 {
		z := rand.NewZipf(rng, s, 1, uint64(n-1))
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return rng.IntN(max(1, n)) }
}

func systemPrompts(d *ids, n, blocks int) [][]int64 {
	out := make([][]int64, n)
	for i := range out {
		out[i] = d.blocks(blocks)
	}
	return out
}

// tenantRequests makes single-turn requests behind a tenant's system prompt
// at the given arrival times.
func tenantRequest(d *ids, k Knobs, sys []int64, at float64, rng *rand.Rand) *Request {
	user := 1 + rng.IntN(max(1, k.int("user")))
	return request(at, append(slices.Clone(sys), d.blocks(user)...), k.int("out"), true, rng)
}

func genTenants(k Knobs, rng *rand.Rand) []*Request {
	d := &ids{}
	sys := systemPrompts(d, max(1, k.int("tenants")), k.int("system"))
	pick := zipfPicker(rng, k["zipf"], len(sys))
	arr := &poisson{rate: k["rate"], rng: rng}
	var out []*Request
	for range k.int("n") {
		out = append(out, tenantRequest(d, k, sys[pick()], arr.next(), rng))
	}
	return out
}

func genSkewed(k Knobs, rng *rand.Rand) []*Request {
	d := &ids{}
	sys := systemPrompts(d, max(2, k.int("tenants")), k.int("system"))
	arr := &poisson{rate: k["rate"], rng: rng}
	var out []*Request
	for range k.int("n") {
		t := 0
		if rng.Float64() >= k["hot"] {
			t = 1 + rng.IntN(len(sys)-1)
		}
		out = append(out, tenantRequest(d, k, sys[t], arr.next(), rng))
	}
	return out
}

// conversation appends one session's turns: each turn adds add() blocks to
// the context, is sent, and its answer joins the context.
func conversation(out []*Request, d *ids, ctx []int64, start float64, turns int, add int, think float64, outTok int, rng *rand.Rand) []*Request {
	at := start
	for range turns {
		ctx = append(ctx, d.blocks(add)...)
		out = append(out, request(at, ctx, outTok, false, rng))
		ctx = append(ctx, d.blocks(max(1, (outTok+TraceBlock-1)/TraceBlock))...)
		at += rng.ExpFloat64() * think
	}
	return out
}

func genChat(k Knobs, rng *rand.Rand) []*Request {
	d := &ids{}
	sys := d.blocks(k.int("system"))
	arr := &poisson{rate: k["rate"], rng: rng}
	var out []*Request
	for len(out) < k.int("n") {
		out = conversation(out, d, slices.Clone(sys), arr.next(), geometric(rng, k["turns"]), max(1, k.int("user")), k["think"], k.int("out"), rng)
	}
	return out
}

func genAgent(k Knobs, rng *rand.Rand) []*Request {
	d := &ids{}
	arr := &poisson{rate: k["rate"], rng: rng}
	var out []*Request
	for len(out) < k.int("n") {
		// Each session has its own long context (instructions, tools, the
		// task's files); its first turn carries it whole.
		out = conversation(out, d, d.blocks(k.int("context")), arr.next(), geometric(rng, k["steps"]), max(1, k.int("tool")), k["think"], k.int("out"), rng)
	}
	return out
}

func genRAG(k Knobs, rng *rand.Rand) []*Request {
	d := &ids{}
	sys := d.blocks(k.int("system"))
	docs := systemPrompts(d, max(1, k.int("docs")), max(1, k.int("docblocks")))
	pick := zipfPicker(rng, k["zipf"], len(docs))
	arr := &poisson{rate: k["rate"], rng: rng}
	var out []*Request
	for range k.int("n") {
		blocks := slices.Clone(sys)
		var chosen []int
		for len(chosen) < min(k.int("k"), len(docs)) {
			if i := pick(); !slices.Contains(chosen, i) {
				chosen = append(chosen, i)
			}
		}
		for _, i := range chosen {
			blocks = append(blocks, docs[i]...)
		}
		blocks = append(blocks, d.blocks(max(1, k.int("question")))...)
		out = append(out, request(arr.next(), blocks, k.int("out"), true, rng))
	}
	return out
}

// diurnalRate is the arrival rate at time t: a day curve compressed to
// period, times burst inside a burst window.
func diurnalRate(k Knobs, t float64, bursts []float64) float64 {
	r := k["rate"] * (1 + k["amp"]*math.Sin(2*math.Pi*t/max(1, k["period"])))
	i := sort.SearchFloat64s(bursts, t)
	if i > 0 && t-bursts[i-1] < k["burstlen"] {
		r *= max(1, k["burst"])
	}
	return max(r, 0)
}

func genDiurnal(k Knobs, rng *rand.Rand) []*Request {
	d := &ids{}
	sys := systemPrompts(d, max(1, k.int("tenants")), k.int("system"))
	peak := k["rate"] * (1 + k["amp"]) * max(1, k["burst"])
	// Burst starts, generously past the trace's likely end.
	var bursts []float64
	horizon := 4 * float64(k.int("n")) / k["rate"]
	for t := 0.0; t < horizon && k["burstevery"] > 0; {
		t += rng.ExpFloat64() * k["burstevery"]
		bursts = append(bursts, t)
	}
	// Thinning: candidates at the peak rate, kept with rate(t)/peak.
	arr := &poisson{rate: peak, rng: rng}
	var out []*Request
	for len(out) < k.int("n") {
		t := arr.next()
		if rng.Float64()*peak > diurnalRate(k, t, bursts) {
			continue
		}
		out = append(out, tenantRequest(d, k, sys[rng.IntN(len(sys))], t, rng))
	}
	return out
}

func genMixed(k Knobs, rng *rand.Rand) []*Request {
	d := &ids{}
	sys := systemPrompts(d, max(1, k.int("groups")), k.int("system"))
	arr := &poisson{rate: k["rate"], rng: rng}
	lo, hi := max(1, k.int("longmin")), max(1, k.int("longmax"))
	var out []*Request
	for range k.int("n") {
		blocks := slices.Clone(sys[rng.IntN(len(sys))])
		if rng.Float64() < k["long"] {
			blocks = append(blocks, d.blocks(lo+rng.IntN(max(1, hi-lo+1)))...)
		} else {
			blocks = append(blocks, d.blocks(1+rng.IntN(max(1, k.int("short"))))...)
		}
		out = append(out, request(arr.next(), blocks, k.int("out"), true, rng))
	}
	return out
}
