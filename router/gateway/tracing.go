package gateway

// Tracing: with Config.TracerProvider set, every request on /v1/* gets a
// server span (the client's W3C traceparent, when it sends one, is its
// parent) and child spans for admission, tokenization, the routing decision,
// each upstream attempt and each prefill/decode leg; the upstream requests
// carry the attempt's traceparent, so an engine that exports traces (vLLM's
// --otlp-traces-endpoint) joins the trace. Without a provider every hook is
// one nil check: no span, no context, no allocation.

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/oasis-llm/oasis/router/scoring"
)

// TracerName is the instrumentation scope of the router's spans.
const TracerName = "github.com/oasis-llm/oasis/router/gateway"

// Span names.
const (
	SpanAdmission = "oasis.admission"
	SpanTokenize  = "oasis.tokenize"
	SpanRoute     = "oasis.route"
	SpanUpstream  = "oasis.upstream"
	SpanPrefill   = "oasis.pd.prefill"
	SpanDecode    = "oasis.pd.decode"
	// SpanMigrate is a stream's continuation on another engine after its
	// engine failed mid-stream (migrate.go): one per leg.
	SpanMigrate = "oasis.migrate"
	// SpanColdStart is a request held while its model scales from zero
	// (coldstart.go).
	SpanColdStart = "oasis.cold_start"
)

// Attribute keys of the router's spans (README: Tracing).
const (
	AttrModel         = attribute.Key("gen_ai.request.model")
	AttrRequestID     = attribute.Key("oasis.request_id")
	AttrWorker        = attribute.Key("oasis.worker")
	AttrWorkerAddress = attribute.Key("server.address")
	AttrPolicy        = attribute.Key("oasis.policy")
	AttrTermPrefix    = "oasis.policy.term." // + term name: its value for the chosen worker
	AttrWeightPrefix  = "oasis.policy.weight."
	AttrCandidates    = attribute.Key("oasis.candidates")
	AttrPrefixBlocks  = attribute.Key("oasis.prefix.blocks")
	AttrPrefixMatched = attribute.Key("oasis.prefix.blocks_matched")
	AttrPrefixGPU     = attribute.Key("oasis.prefix.blocks_gpu")
	AttrPrefixTier    = attribute.Key("oasis.prefix.tier")
	AttrQueueWait     = attribute.Key("oasis.queue_wait_ms")
	AttrRetries       = attribute.Key("oasis.retries")
	AttrTTFT          = attribute.Key("oasis.ttft_ms")
	AttrPromptTokens  = attribute.Key("gen_ai.usage.input_tokens")
	AttrOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")
	AttrStatus        = attribute.Key("http.response.status_code")
	AttrPrefill       = attribute.Key("oasis.pd.prefill_worker")
	AttrDecode        = attribute.Key("oasis.pd.decode_worker")
	AttrMigrationLeg  = attribute.Key("oasis.migration.leg")           // 1 for the first continuation
	AttrResentTokens  = attribute.Key("oasis.migration.resent_tokens") // prompt + tokens already generated
)

// tracing is the gateway's tracer and propagator; nil when off.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
}

func newTracing(tp trace.TracerProvider) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer(TracerName)}
}

// reqTrace is one request's server span and what its attributes need.
type reqTrace struct {
	t        *tracing
	span     trace.Span
	retries  int
	admitted time.Time     // when admission began
	ttft     time.Duration // to the first response byte; 0: none yet
	tokens   [2]int64      // prompt and completion tokens, when the engine reported usage
}

// firstByte records the time to the first response byte.
func (rt *reqTrace) firstByte(d time.Duration) {
	if rt != nil {
		rt.ttft = d
	}
}

// usage records the engine's token counts.
func (rt *reqTrace) usage(prompt, completion int64) {
	if rt != nil {
		rt.tokens = [2]int64{prompt, completion}
	}
}

// startRequest starts the request's server span, a child of the client's
// traceparent when there is one; nil when tracing is off.
func (t *tracing) startRequest(ctx context.Context, r *http.Request) (context.Context, *reqTrace) {
	if t == nil {
		return ctx, nil
	}
	ctx = t.prop.Extract(ctx, propagation.HeaderCarrier(r.Header))
	ctx, sp := t.tracer.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
	return ctx, &reqTrace{t: t, span: sp}
}

// start starts a child span of ctx's (internal); a no-op span when off.
func (rt *reqTrace) start(ctx context.Context, name string) (context.Context, trace.Span) {
	if rt == nil {
		return ctx, noSpan()
	}
	return rt.t.tracer.Start(ctx, name)
}

// noSpan is the span hooks return with tracing off: OpenTelemetry's no-op
// span (a zero-size value: no allocation).
func noSpan() trace.Span { return trace.SpanFromContext(context.Background()) }

// identify records the request's model and id once parsed.
func (rt *reqTrace) identify(model, reqID string) {
	if rt != nil && rt.span.IsRecording() {
		rt.span.SetAttributes(AttrModel.String(model), AttrRequestID.String(reqID))
	}
}

// admission starts the admission span.
func (rt *reqTrace) admission(ctx context.Context) (context.Context, trace.Span) {
	if rt == nil {
		return ctx, noSpan()
	}
	rt.admitted = time.Now()
	return rt.t.tracer.Start(ctx, SpanAdmission)
}

// queued records the admission wait on both spans and ends sp.
func (rt *reqTrace) queued(sp trace.Span, err error) {
	if rt == nil {
		return
	}
	ms := float64(time.Since(rt.admitted).Microseconds()) / 1000
	rt.span.SetAttributes(AttrQueueWait.Float64(ms))
	sp.SetAttributes(AttrQueueWait.Float64(ms))
	endSpan(sp, err)
}

// wrapTokenize makes the request's tokenization a span (a child of the
// routing decision, which asks for the tokens).
func (rt *reqTrace) wrapTokenize(req *scoring.Request) {
	if rt == nil || req.Tokenize == nil || !rt.span.IsRecording() {
		return
	}
	tok := req.Tokenize
	req.Tokenize = func(ctx context.Context, r *scoring.Request) ([]uint32, error) {
		ctx, sp := rt.t.tracer.Start(ctx, SpanTokenize)
		ids, err := tok(ctx, r)
		sp.SetAttributes(attribute.Int("oasis.prompt_tokens", len(ids)))
		endSpan(sp, err)
		return ids, err
	}
}

// decided records a routing decision (the plan p) on its span and on the request span:
// the policy, the chosen worker, each weighted term's value for it (scored
// again: only for recorded spans) and the prefix match.
func (rt *reqTrace) decided(ctx context.Context, sp trace.Span, sel *scoring.Selector, x *exchange,
	cands []*scoring.Worker, p planWorker) {
	if rt == nil || !sp.IsRecording() {
		return
	}
	wk := p.wk
	cfg := x.pol.Scoring
	attrs := []attribute.KeyValue{AttrPolicy.String(cfg.Policy), AttrWorker.String(wk.ID),
		AttrCandidates.Int(len(cands))}
	for _, tv := range sel.Explain(ctx, cfg, x.req, cands, wk) {
		attrs = append(attrs, attribute.Float64(AttrTermPrefix+tv.Name, tv.Value),
			attribute.Float64(AttrWeightPrefix+tv.Name, tv.Weight))
	}
	if m, ok := x.req.PrefixMatchOn(wk.ID); ok {
		attrs = append(attrs, AttrPrefixBlocks.Int(m.Blocks), AttrPrefixMatched.Int(m.Matched),
			AttrPrefixGPU.Int(m.GPUBlocks), AttrPrefixTier.String(m.Tier()))
	}
	sp.SetAttributes(attrs...)
	rt.span.SetAttributes(attrs...)
}

// pairDecided records a prefill/decode pair plan.
func (rt *reqTrace) pairDecided(sp trace.Span, p *planPair) {
	if rt == nil || !sp.IsRecording() {
		return
	}
	pair := p.pair
	attrs := []attribute.KeyValue{AttrPolicy.String("pd_pair"), AttrPrefill.String(pair.Prefill.ID),
		AttrDecode.String(pair.Decode.ID)}
	sp.SetAttributes(attrs...)
	rt.span.SetAttributes(attrs...)
}

// attempt starts an upstream attempt's span (client kind) to wk; name is
// SpanUpstream, SpanPrefill or SpanDecode. The caller ends it with the
// attempt's error (endSpan).
func (t *tracing) attempt(ctx context.Context, name string, wk *scoring.Worker) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noSpan()
	}
	return t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrWorker.String(wk.ID), AttrWorkerAddress.String(wk.Address)))
}

// inject sets the upstream request's traceparent from ctx's span.
func (t *tracing) inject(ctx context.Context, h http.Header) {
	if t != nil {
		t.prop.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// retried counts a retry (on another worker or pair).
func (rt *reqTrace) retried() {
	if rt != nil {
		rt.retries++
	}
}

// end finishes the request span with the request's outcome.
func (rt *reqTrace) end(o *outcome) {
	if rt == nil {
		return
	}
	if rt.span.IsRecording() {
		attrs := []attribute.KeyValue{AttrStatus.Int(o.status), AttrRetries.Int(rt.retries)}
		if o.worker != "" {
			attrs = append(attrs, AttrWorker.String(o.worker))
		}
		if o.ttftDone {
			attrs = append(attrs, AttrTTFT.Float64(float64(rt.ttft.Microseconds())/1000))
		}
		if rt.tokens != [2]int64{} {
			attrs = append(attrs, AttrPromptTokens.Int64(rt.tokens[0]), AttrOutputTokens.Int64(rt.tokens[1]))
		}
		rt.span.SetAttributes(attrs...)
		if o.status >= 500 {
			rt.span.SetStatus(codes.Error, strconv.Itoa(o.status))
		}
	}
	rt.span.End()
}

// endSpan ends sp, marking it failed when err is not nil.
func endSpan(sp trace.Span, err error) {
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
