package metrics

import "github.com/prometheus/client_golang/prometheus"

// Peers are the instruments of the state a datacenter's routers share
// (router/peers), and of the tenants (API keys) whose limits they share.
type Peers struct {
	// PeersLive is the number of routers budgets are split over, this one
	// included: the union of the gossip members alive and the passing
	// Consul registrations.
	PeersLive prometheus.Gauge
	// PeersGossip is the number of routers this one exchanges load with
	// (gossip members alive, this one included); 0 without gossip.
	PeersGossip prometheus.Gauge
	// PeerMessages counts load messages from peers, by result (ok|rejected).
	PeerMessages *prometheus.CounterVec // result
	// AdmissionShare is this router's share of a model's max_in_flight.
	AdmissionShare *prometheus.GaugeVec // model
	// PeersInFlight is the requests the other routers said they have in
	// flight to engines, all engines together (what the load and ttft
	// terms add to this router's own).
	PeersInFlight prometheus.Gauge
	// KeyTokens counts tokens from the engines' usage per API key id and
	// kind (prompt|completion), for chargeback; a key's series go when it
	// leaves the key document (auth.Authenticator.Tokens).
	KeyTokens *prometheus.CounterVec // key, kind
}

// newPeers registers them under their full names (the alerts read them).
func newPeers(reg prometheus.Registerer) Peers {
	p := Peers{
		PeersLive: prometheus.NewGauge(prometheus.GaugeOpts{Name: "oasis_router_peers_live",
			Help: "Routers of the datacenter budgets are split over, this one included (gossip members alive ∪ passing Consul registrations)."}),
		PeersGossip: prometheus.NewGauge(prometheus.GaugeOpts{Name: "oasis_router_peers_gossip",
			Help: "Routers this one exchanges load with over gossip, this one included; 0 without gossip (-peers-listen off: the routers are only counted)."}),
		PeerMessages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_router_peer_messages_total",
			Help: "Load messages received from peer routers, by result (ok|rejected)."}, []string{"result"}),
		AdmissionShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "oasis_router_admission_share",
			Help: "This router's share of a model's max_in_flight, split over the datacenter's live routers."}, []string{"model"}),
		PeersInFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "oasis_router_peers_in_flight",
			Help: "Requests the datacenter's other routers said they have in flight to engines, all engines together."}),
		KeyTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_router_key_tokens_total",
			Help: "Tokens reported in the engines' usage objects, by API key id (from the key document) and kind (prompt|completion)."}, []string{"key", "kind"}),
	}
	reg.MustRegister(p.PeersLive, p.PeersGossip, p.PeerMessages, p.AdmissionShare, p.PeersInFlight, p.KeyTokens)
	return p
}
