package enginestats

import (
	"context"

	nomadapi "github.com/hashicorp/nomad/api"
)

// GPUHealth counts the GPU instances of a Nomad node by health, as the
// node's device fingerprints report it.
func GPUHealth(n *nomadapi.Node) (healthy, unhealthy int) {
	if n == nil || n.NodeResources == nil {
		return 0, 0
	}
	for _, d := range n.NodeResources.Devices {
		if d == nil || d.Type != "gpu" {
			continue
		}
		for _, inst := range d.Instances {
			if inst == nil {
				continue
			}
			if inst.Healthy {
				healthy++
			} else {
				unhealthy++
			}
		}
	}
	return healthy, unhealthy
}

// pollGPUHealth reads the nodes' device fingerprints into the router's
// node_gpus gauge, for alerting on GPUs the device plugin marks unhealthy
// (Nomad exports no device metrics of its own). A node no longer read is
// dropped from the gauge.
func (s *Scraper) pollGPUHealth(ctx context.Context, nodes map[string]struct{}) {
	s.m.NodeGPUs.Reset()
	for id := range nodes {
		n, _, err := s.nomad.Nodes().Info(id, (&nomadapi.QueryOptions{}).WithContext(ctx))
		if err != nil {
			s.log.Debug("reading node devices failed", "node", id, "error", err)
			continue
		}
		healthy, unhealthy := GPUHealth(n)
		s.m.NodeGPUs.WithLabelValues(id, "healthy").Set(float64(healthy))
		s.m.NodeGPUs.WithLabelValues(id, "unhealthy").Set(float64(unhealthy))
	}
}
