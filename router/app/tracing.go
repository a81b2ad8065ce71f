package app

import (
	"context"
	"math"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ServiceName is the router's service.name in the traces it exports.
const ServiceName = "oasis-router"

// tracingShutdownTimeout bounds the export of the last spans at Close.
const tracingShutdownTimeout = 5 * time.Second

// validateTracing checks -otlp-endpoint and -trace-sample-ratio.
func (c Config) validateTracing() error {
	r := c.TraceSampleRatio
	if math.IsNaN(r) || r < 0 || r > 1 {
		return flagErr("-trace-sample-ratio", "want a fraction from 0 to 1, got %v", r)
	}
	if c.OTLPEndpoint == "" {
		return nil
	}
	u, err := url.Parse(c.OTLPEndpoint)
	switch {
	case err != nil:
		return flagErr("-otlp-endpoint", "%w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return flagErr("-otlp-endpoint", "want an http:// or https:// URL of an OTLP/HTTP receiver, got %q", c.OTLPEndpoint)
	case u.Host == "" || u.Port() == "":
		return flagErr("-otlp-endpoint", "want host:port in %q (OTLP/HTTP listens on 4318 by default)", c.OTLPEndpoint)
	}
	return nil
}

// initTracing builds the tracer provider the gateway gets: Config's own, or
// an OTLP/HTTP exporter to -otlp-endpoint sampling -trace-sample-ratio of
// new traces (a client's traceparent decides for its own). Neither: no
// tracing.
func (a *App) initTracing() error {
	if a.cfg.TracerProvider != nil {
		a.tracer = a.cfg.TracerProvider
		return nil
	}
	if a.cfg.OTLPEndpoint == "" {
		return nil
	}
	u, _ := url.Parse(a.cfg.OTLPEndpoint) // validated
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return flagErr("-otlp-endpoint", "%w", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", ServiceName))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(a.cfg.TraceSampleRatio))))
	a.tracer, a.tracerShutdown = tp, tp.Shutdown
	return nil
}

// closeTracing exports the spans still buffered.
func (a *App) closeTracing() error {
	if a.tracerShutdown == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
	defer cancel()
	err := a.tracerShutdown(ctx)
	a.tracerShutdown = nil
	return err
}
