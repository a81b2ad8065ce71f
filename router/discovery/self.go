package discovery

import (
	"errors"

	"github.com/oasis-llm/oasis/router/worker"
)

// SelfError is an engine registration whose address is one of the router's
// own listeners: every request sent there would come back to the router.
type SelfError struct{ Address string }

func (e *SelfError) Error() string {
	return "engine address " + e.Address + " is this router's own listener"
}

// checkSelf refuses w when it is the router itself.
func (p *Pool) checkSelf(w *worker.Worker) error {
	if p.self == nil || w.Upstream != "" || !p.self(w.Address) {
		return nil
	}
	return &SelfError{Address: w.Address}
}

// refuseSelf reports a *SelfError refusal once per instance and address;
// false when err is another refusal.
func (p *Pool) refuseSelf(id string, err error) bool {
	var se *SelfError
	if !errors.As(err, &se) {
		return false
	}
	if what := "self\x00" + se.Address; p.rejected[id] != what {
		p.rejected[id] = what
		p.log.Warn("ignoring engine registration whose address is this router's own listener (it would route requests back to itself)",
			"instance", id, "address", se.Address)
		if p.metrics != nil {
			p.metrics.Loops.WithLabelValues("self_address").Inc()
		}
	}
	return true
}
