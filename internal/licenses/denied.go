package licenses

// deniedReason says why Oasis never takes the module at path, whatever the
// licence file of a given version says: products whose later versions are
// under a licence that is not open source (an older, open-source version
// still pulls the product's tree, and an upgrade would silently change the
// licence), and modules under licences the check refuses anyway, listed so
// the failure names the reason. Submodules with their own path (e.g.
// github.com/hashicorp/nomad/api, consul/api) are not covered.
func deniedReason(path string) (string, bool) {
	switch path {
	case "github.com/hashicorp/nomad", "github.com/hashicorp/consul",
		"github.com/hashicorp/terraform", "github.com/hashicorp/vault":
		return "under the Business Source License in its current versions; use its MPL api submodule or speak its protocol", true
	case "github.com/hashicorp/consul/envoyextensions", "github.com/hashicorp/consul/troubleshoot":
		return "not under an open-source licence", true
	case "go.k6.io/k6", "github.com/grafana/grafana", "github.com/grafana/loki/v3", "github.com/grafana/tempo":
		return "under the AGPL", true
	case "github.com/cockroachdb/cockroach", "github.com/redpanda-data/connect/v4", "github.com/rqlite/rqlite/v9", "github.com/unidoc/unioffice":
		return "not under an open-source licence", true
	}
	return "", false
}

// deny sets m.Problem when m's path is on the list of modules not to use.
func (m *Module) deny() {
	if reason, ok := deniedReason(m.Path); ok {
		m.Problem = "on Oasis's list of modules not to use: " + reason
	}
}
