package metrics

import "github.com/prometheus/client_golang/prometheus"

// Protection are the instruments of the router's protections against its
// own traffic and its clients' connections (gateway hop.go, discovery's
// Config.IsSelf, app connlimit.go).
type Protection struct {
	// Loops counts routing loops refused, by reason: self_address (an
	// engine registration whose address is one of the router's own
	// listeners, once per instance and address), own_mark (a request that
	// came back carrying this router's hop mark), hop_limit (a request that
	// had already passed gateway.MaxRouterHops routers).
	Loops *prometheus.CounterVec // reason
	// ClientConnections are the client connections open on the API
	// listener.
	ClientConnections prometheus.Gauge
	// IdleConnsClosed counts idle client connections the router closed to
	// make room, by reason: cap (-max-connections reached), per_source (the
	// source's -max-connections-per-source reached), pressure (idle past
	// the short idle timeout while connections are near the cap).
	IdleConnsClosed *prometheus.CounterVec // reason
	// ConnsRefused counts client connections closed at once, by reason:
	// per_source (the source already had -max-connections-per-source
	// connections, none of them idle).
	ConnsRefused *prometheus.CounterVec // reason
}

func newProtection(reg prometheus.Registerer, ns string) Protection {
	p := Protection{
		Loops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "loops_refused_total",
			Help: "Routing loops refused, by reason: self_address (an engine registration naming one of the router's own listeners, once per instance and address), own_mark (a request that came back carrying this router's Via mark: 508), hop_limit (a request that had passed too many routers: 508)."},
			[]string{"reason"}),
		ClientConnections: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "client_connections",
			Help: "Client connections open on the API listener (-max-connections caps them)."}),
		IdleConnsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "idle_connections_closed_total",
			Help: "Idle client connections the router closed to make room for new ones, by reason: cap (-max-connections reached), per_source (the source's -max-connections-per-source reached), pressure (idle past the short idle timeout while near the cap)."},
			[]string{"reason"}),
		ConnsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "connections_refused_total",
			Help: "Client connections closed as soon as accepted, by reason: per_source (the source already had -max-connections-per-source connections, none idle)."},
			[]string{"reason"}),
	}
	reg.MustRegister(p.Loops, p.ClientConnections, p.IdleConnsClosed, p.ConnsRefused)
	return p
}
