package strategy

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// ErrNotOneValue is returned when a learned-capacity query does not give
// exactly one number.
var ErrNotOneValue = errors.New("query must return one number")

// Prometheus runs instant queries against a Prometheus HTTP API.
type Prometheus struct{ api promv1.API }

// NewPrometheus returns a querier for the Prometheus at addr (http or https URL).
func NewPrometheus(addr string) (*Prometheus, error) {
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) URL", addr)
	}
	c, err := api.NewClient(api.Config{Address: addr})
	if err != nil {
		return nil, err
	}
	return &Prometheus{api: promv1.NewAPI(c)}, nil
}

// Query implements PrefillQuerier: the query's value now, which must be a
// scalar or a one-sample vector.
func (p *Prometheus) Query(ctx context.Context, query string) (float64, error) {
	v, _, _, err := p.api.Query(ctx, query, time.Now())
	if err != nil {
		return 0, err
	}
	switch r := v.(type) {
	case *model.Scalar:
		return float64(r.Value), nil
	case model.Vector:
		if len(r) == 1 {
			return float64(r[0].Value), nil
		}
		return 0, fmt.Errorf("%d samples: %w", len(r), ErrNotOneValue)
	default:
		return 0, fmt.Errorf("a %s: %w", v.Type(), ErrNotOneValue)
	}
}
