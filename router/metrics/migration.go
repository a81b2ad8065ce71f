package metrics

import "github.com/prometheus/client_golang/prometheus"

// Migration are the instruments of in-flight stream migration (gateway
// migrate.go): a stream whose engine failed after its first token goes on
// on another engine.
type Migration struct {
	// Migrations counts streams moved to another engine, by the reason the
	// engine they left failed: engine_failed (its stream broke) or
	// stream_idle (it sent nothing for the stream_idle timeout).
	Migrations *prometheus.CounterVec // model, reason
	// MigrationsFailed counts streams that could not be continued and
	// ended with the SSE error event: limit (migration_limit reached) or
	// no_worker (no engine left to continue on).
	MigrationsFailed *prometheus.CounterVec // model, reason
	// MigrationResentTokens counts the tokens the continuations resent to
	// their new engines: the prompt plus what was already generated.
	MigrationResentTokens *prometheus.CounterVec // model
}

// Reasons of Migrations and MigrationsFailed.
const (
	MigrationEngineFailed = "engine_failed"
	MigrationStreamIdle   = "stream_idle"
	MigrationLimit        = "limit"
	MigrationNoWorker     = "no_worker"
	// MigrationNotContinuable: the continuation could not be built (no
	// max_tokens left, messages not an array).
	MigrationNotContinuable = "not_continuable"
)

func newMigration(reg prometheus.Registerer, ns string) Migration {
	m := Migration{
		Migrations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "migrations_total",
			Help: "Streams continued on another engine after their engine failed past the first token, by the reason (engine_failed|stream_idle)."},
			[]string{"model", "reason"}),
		MigrationsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "migrations_failed_total",
			Help: "Streams that could not be continued and ended with the SSE error event, by reason (limit|no_worker|not_continuable)."},
			[]string{"model", "reason"}),
		MigrationResentTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "migration_resent_tokens_total",
			Help: "Tokens the stream continuations sent to their new engines: the prompt plus the tokens already generated (re-prefilled unless cached there)."},
			[]string{"model"}),
	}
	reg.MustRegister(m.Migrations, m.MigrationsFailed, m.MigrationResentTokens)
	return m
}
