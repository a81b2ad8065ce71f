package enginestats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/worker"
)

// DefaultPowerMetrics returns the engine gauges, in watts, read as the
// engine's own GPU power draw (oasis-sim exposes one; real engines do not).
func DefaultPowerMetrics() []string {
	return []string{"oasis_sim_power_watts", "oasis_sim_gpu_power_watts"}
}

// DefaultMaxMetricsBytes is far above an engine's metrics page (vLLM's and
// SGLang's are tens to hundreds of KiB, histograms included).
const DefaultMaxMetricsBytes = 4 << 20

// ErrPageTooLarge means an engine's metrics page exceeded
// ScraperConfig.MaxMetricsBytes and was refused unread past it.
var ErrPageTooLarge = errors.New("metrics page too large")

// ScraperConfig configures a Scraper.
type ScraperConfig struct {
	// Pool holds the workers to scrape; required.
	Pool *discovery.Pool
	// HTTP reads the engines' metrics pages (default http.DefaultClient);
	// each read is bounded by Interval.
	HTTP *http.Client
	// Interval is how often the engines are scraped (default 1s).
	Interval time.Duration
	// Nomad, when set, is asked for node stats every PowerInterval
	// (default 5s).
	Nomad         *nomadapi.Client
	PowerInterval time.Duration
	// PowerMetrics are the engine gauges read as GPU power (default
	// DefaultPowerMetrics).
	PowerMetrics []string
	// MaxMetricsBytes bounds what is read of one metrics page (default
	// DefaultMaxMetricsBytes): a larger page is refused, counted in
	// EngineAnswerRefused{kind="metrics"}, and the engine's metrics are
	// unknown until it serves a smaller one.
	MaxMetricsBytes int64
	// Metrics takes scrape errors and worker power; nil keeps them in
	// collectors registered nowhere.
	Metrics *metrics.Metrics
	// Logger receives the scraper's logs; nil discards them.
	Logger hclog.Logger
}

// Scraper periodically reads every worker's metrics page and, when a Nomad
// client is set, the GPU power of each worker's node, and stores the result
// in the workers' Live signals.
type Scraper struct {
	pool          *discovery.Pool
	http          *http.Client
	interval      time.Duration
	nomad         *nomadapi.Client
	powerInterval time.Duration
	powerMetrics  []string
	maxBytes      int64
	m             *metrics.Metrics
	log           hclog.Logger

	mu    sync.Mutex
	state map[string]*workerState // by worker id
	nodeW map[string]float64      // node id → GPU watts
	// statsFailing is whether the last node statistics read failed: a
	// failure is logged as a warning once, not at every poll.
	statsFailing bool
	energy       map[string]energySample // node id → last cumulative GPU energy
}

// NewScraper returns a scraper of cfg.Pool's workers; Run starts it.
func NewScraper(cfg ScraperConfig) (*Scraper, error) {
	if cfg.Pool == nil {
		return nil, errors.New("creating scraper: a worker pool is required")
	}
	if cfg.HTTP == nil {
		cfg.HTTP = http.DefaultClient
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.PowerInterval <= 0 {
		cfg.PowerInterval = 5 * time.Second
	}
	if cfg.PowerMetrics == nil {
		cfg.PowerMetrics = DefaultPowerMetrics()
	}
	if cfg.MaxMetricsBytes <= 0 {
		cfg.MaxMetricsBytes = DefaultMaxMetricsBytes
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Scraper{
		pool: cfg.Pool, http: cfg.HTTP, interval: cfg.Interval, nomad: cfg.Nomad, powerInterval: cfg.PowerInterval,
		powerMetrics: cfg.PowerMetrics, maxBytes: cfg.MaxMetricsBytes, m: cfg.Metrics, log: cfg.Logger,
		state: map[string]*workerState{}, nodeW: map[string]float64{}, energy: map[string]energySample{},
	}, nil
}

type energySample struct {
	joules float64
	at     time.Time
}

type workerState struct {
	lastGen   float64 // engine generation-token counter at lastAt
	lastOwn   int64   // router-counted generated tokens at lastAt
	lastAt    time.Time
	haveFirst bool
	eff       float64 // smoothed tokens per joule
	lastRun   float64 // sequences running at lastAt
	seqEff    float64 // smoothed tokens per joule per running sequence
	refused   bool    // the last scrape's page was over the bound (warned once)
}

// Run scrapes until ctx ends; it returns nil then.
func (s *Scraper) Run(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	var lastPower time.Time
	for {
		if s.nomad != nil && time.Since(lastPower) >= s.powerInterval {
			s.pollNodes(ctx)
			lastPower = time.Now()
		}
		s.scrapeAll(ctx, s.interval)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Scraper) pollNodes(ctx context.Context) {
	nodes := map[string]struct{}{}
	for _, w := range s.pool.All() {
		if w.Node != "" {
			nodes[w.Node] = struct{}{}
		}
	}
	got := map[string]float64{}
	now := time.Now()
	for n := range nodes {
		hs, err := s.nomad.Nodes().Stats(n, (&nomadapi.QueryOptions{}).WithContext(ctx))
		s.noteStatsRead(n, err)
		if err != nil {
			continue
		}
		if w, ok := s.nodeWatts(n, hs, now); ok {
			got[n] = w
		}
	}
	s.mu.Lock()
	s.nodeW = got
	s.mu.Unlock()
	s.pollGPUHealth(ctx, nodes)
}

// noteStatsRead counts a node statistics read and logs a change between
// failing and working: a token without node read (ACLs) fails every poll.
func (s *Scraper) noteStatsRead(node string, err error) {
	if err == nil {
		s.m.NodeStatsReads.WithLabelValues("ok").Inc()
		if s.statsFailing {
			s.log.Info("reading Nomad node statistics works again", "node", node)
		}
		s.statsFailing = false
		return
	}
	s.m.NodeStatsReads.WithLabelValues("error").Inc()
	if !s.statsFailing {
		s.log.Warn("reading Nomad node statistics failed: GPU power is not known (with Nomad ACLs the token needs node read)", "node", node, "error", err)
	} else {
		s.log.Debug("reading node stats failed", "node", node, "error", err)
	}
	s.statsFailing = true
}

// nodeWatts is the node's GPU power: average power from the energy counters
// since the last poll when the devices report energy (exact over the whole
// interval), else the instantaneous draw.
func (s *Scraper) nodeWatts(node string, hs *nomadapi.HostStats, now time.Time) (float64, bool) {
	j, haveJ := NodeEnergyJoules(hs)
	if haveJ {
		prev, seen := s.energy[node]
		s.energy[node] = energySample{joules: j, at: now}
		if dt := now.Sub(prev.at).Seconds(); seen && dt > 0 && j >= prev.joules {
			return (j - prev.joules) / dt, true
		}
	} else {
		delete(s.energy, node)
	}
	return NodePowerWatts(hs)
}

func (s *Scraper) scrapeAll(ctx context.Context, timeout time.Duration) {
	workers := s.pool.All()
	perNode := map[string]int{}
	for _, w := range workers {
		perNode[w.Node]++
	}
	var wg sync.WaitGroup
	for _, w := range workers {
		if w.MetricsPath == "" {
			continue // a hosted endpoint publishes no engine metrics
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.scrapeOne(ctx, w, timeout, perNode[w.Node])
		}()
	}
	wg.Wait()
	// Forget workers that left the pool.
	s.mu.Lock()
	live := make(map[string]bool, len(workers))
	for _, w := range workers {
		live[w.ID] = true
	}
	for id := range s.state {
		if !live[id] {
			delete(s.state, id)
			s.m.WorkerPower.DeletePartialMatch(prometheus.Labels{"worker": id})
		}
	}
	s.mu.Unlock()
}

func (s *Scraper) scrapeOne(ctx context.Context, w *worker.Worker, timeout time.Duration, sameNode int) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	em, err := s.fetch(ctx, w)
	now := time.Now()
	if err != nil {
		w.Live.ClearEngine()
		s.m.ScrapeErrors.WithLabelValues(w.ID).Inc()
		if errors.Is(err, ErrPageTooLarge) {
			s.m.EngineAnswerRefused.WithLabelValues(metrics.EngineLabel(w.Engine), "metrics").Inc()
		} else {
			s.log.Debug("scraping engine metrics failed", "worker", w.ID, "error", err)
		}
	} else if em.HasLoad {
		w.Live.SetEngine(em.Running, em.Waiting, em.KVUsage, now)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state[w.ID]
	if st == nil {
		st = &workerState{}
		s.state[w.ID] = st
	}
	// A refused page is logged once until the engine serves a good one.
	refused := errors.Is(err, ErrPageTooLarge)
	if refused && !st.refused {
		s.log.Warn("refused an engine's metrics page over the size bound; its load signals are unknown until it serves a smaller one",
			"worker", w.ID, "engine", w.Engine, "error", err)
	}
	st.refused = refused
	// Power attributed to this worker: its own gauge, else its node's GPU
	// power shared equally by the engines on that node.
	watts, haveW := 0.0, false
	if err == nil && em.HasPower {
		watts, haveW = em.PowerWatts, true
	} else if nw, ok := s.nodeW[w.Node]; ok && w.Node != "" && sameNode > 0 {
		watts, haveW = nw/float64(sameNode), true
	}
	if haveW {
		s.m.WorkerPower.WithLabelValues(w.Model, w.ID, w.Node).Set(watts)
	}
	own := w.Live.Generated()
	// Sequences running: the engine's count, else the router's own in-flight.
	running := float64(w.Live.Snapshot().InFlight)
	if err == nil && em.HasLoad {
		running = em.Running
	}
	if st.haveFirst {
		dt := now.Sub(st.lastAt).Seconds()
		var gen float64
		if err == nil && em.HasGenTokens {
			gen = em.GenTokens - st.lastGen
		} else {
			gen = float64(own - st.lastOwn)
		}
		if dt > 0 && gen >= 0 && haveW {
			tps := gen / dt
			if tps > 0 && watts > 0 {
				e := tps / watts
				// The interval's batch: the mean of the running counts at its ends.
				st.eff = smooth(st.eff, e)
				st.seqEff = smooth(st.seqEff, e/max(1, (st.lastRun+running)/2))
			}
			w.Live.SetPower(watts, tps, st.eff, st.seqEff)
		}
	}
	st.haveFirst = true
	st.lastAt = now
	st.lastRun = running
	st.lastOwn = own
	if err == nil && em.HasGenTokens {
		st.lastGen = em.GenTokens
	}
}

func (s *Scraper) fetch(ctx context.Context, w *worker.Worker) (EngineMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+w.Address+w.MetricsPath, nil)
	if err != nil {
		return EngineMetrics{}, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return EngineMetrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return EngineMetrics{}, fmt.Errorf("GET %s: %s", w.MetricsPath, resp.Status)
	}
	if resp.ContentLength > s.maxBytes {
		return EngineMetrics{}, fmt.Errorf("GET %s: %d bytes, at most %d: %w", w.MetricsPath, resp.ContentLength, s.maxBytes, ErrPageTooLarge)
	}
	body := &boundedReader{r: resp.Body, left: s.maxBytes}
	em, err := ParseEngineMetrics(body, s.powerMetrics)
	if body.over {
		return EngineMetrics{}, fmt.Errorf("GET %s: more than %d bytes: %w", w.MetricsPath, s.maxBytes, ErrPageTooLarge)
	}
	return em, err
}

// boundedReader reads at most left bytes of r, then fails, and says so
// (over): the parser may wrap or drop the error.
type boundedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a page of exactly the bound from a longer one.
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			b.over = true
			return 0, ErrPageTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// smooth folds sample x into the exponentially smoothed v (0: none yet).
func smooth(v, x float64) float64 {
	if v == 0 {
		return x
	}
	return 0.7*v + 0.3*x
}
