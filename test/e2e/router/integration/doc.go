// Package integration tests oasis-router's packages against a real Consul
// agent (`consul agent -dev` on free loopback ports, started by TestMain) and
// real oasis-sim engine processes. The Consul fault tests start their own
// Consul: a 3-server cluster whose leader they kill, and a client agent the
// router binary talks to, as on a production node. The consul binary is
// bin/consul at the repository root (`make hashistack`) or $OASIS_CONSUL_BIN.
//
// These agents run without ACLs: the tests are about the router's behaviour
// against Consul (discovery, KV, faults), not about tokens, and start in a
// fraction of the time. Tokens and least privilege are tested on the
// ACL-enabled test bed (test/e2e/router, test/e2e/localstack).
package integration
