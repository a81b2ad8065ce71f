// Package admission caps concurrent requests per model, with a bounded queue
// in front of the cap: higher priority bands first, tenants of a band in
// turn (Class).
package admission

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/policy"
)

// Refusal reasons.
var (
	ErrQueueFull    = errors.New("admission queue full")       // → 429
	ErrQueueTimeout = errors.New("timed out waiting in queue") // → 503
)

// Controller admits requests per model under limits that may change at any
// time (the policy document is reloaded live). The zero value is not usable;
// call New.
type Controller struct {
	mu     sync.Mutex
	models map[string]*gate // never removed: a Slot keeps its model's gate

	// OnQueue, when set, is called with a model's queue length whenever it
	// changes (under the controller's lock: keep it cheap, e.g. a gauge Set).
	OnQueue func(model string, queued int)

	// Share, when set, turns a model's max_in_flight (the datacenter's cap)
	// into this router's part of it (peers.Peers.ModelShare, which learns
	// this router's demand from Loads). Called under the controller's lock:
	// it must not call back into the controller. Set it before the first
	// Acquire.
	Share func(model string, max int) int
}

type gate struct {
	inFlight int
	waiters  queue         // by priority band, tenants in turn within a band
	lim      policy.Limits // the limits of the latest Acquire, for Refill
}

// Load is one model's admitted and waiting requests, and the highest
// priority band among those waiting (0 when none wait).
type Load struct {
	InFlight, Queued int
	Band             int
}

// New returns an empty controller.
func New() *Controller { return &Controller{models: map[string]*gate{}} }

// Acquire waits for an in-flight slot for model under lim. It returns a
// release func on success. It fails at once with ErrQueueFull when the queue
// is full, with ErrQueueTimeout after lim.QueueTimeout, or with ctx's error.
func (c *Controller) Acquire(ctx context.Context, model string, lim policy.Limits) (release func(), err error) {
	if _, err := c.acquire(ctx, model, lim); err != nil {
		return nil, err
	}
	return c.releaser(model, lim), nil
}

// Slot is an admitted request's in-flight slot (AcquireSlot).
type Slot struct {
	c     *Controller
	g     *gate // the model's, which is never removed: no map lookup on Release
	model string
	lim   policy.Limits
}

// AcquireSlot is Acquire returning the slot as a value, without the release
// closure Acquire allocates: Release must be called exactly once.
func (c *Controller) AcquireSlot(ctx context.Context, model string, lim policy.Limits) (Slot, error) {
	g, err := c.acquire(ctx, model, lim)
	if err != nil {
		return Slot{}, err
	}
	return Slot{c: c, g: g, model: model, lim: lim}, nil
}

// Release frees the slot.
func (s Slot) Release() {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.c.handOff(s.model, s.g, s.lim)
}

// acquire returns the model's gate with a slot taken in it.
func (c *Controller) acquire(ctx context.Context, model string, lim policy.Limits) (_ *gate, err error) {
	c.mu.Lock()
	g := c.models[model]
	if g == nil {
		g = &gate{}
		c.models[model] = g
	}
	g.lim = lim
	c.fill(model, g, lim)
	if lim.MaxInFlight <= 0 || (g.waiters.len() == 0 && g.inFlight < c.capOf(model, lim)) {
		g.inFlight++
		c.mu.Unlock()
		return g, nil
	}
	if g.waiters.len() >= lim.MaxQueue {
		c.mu.Unlock()
		return nil, ErrQueueFull
	}
	ch := make(chan struct{})
	me := &waiter{ch: ch, class: classOf(ctx)}
	g.waiters.push(me)
	c.queued(model, g)
	c.mu.Unlock()

	var timeout <-chan time.Time
	if lim.QueueTimeout > 0 {
		t := time.NewTimer(lim.QueueTimeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ch:
		return g, nil
	case <-timeout:
		err = ErrQueueTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.waiters.remove(me) {
		c.queued(model, g)
		return nil, err
	}
	// Handed a slot while giving up: pass it on.
	c.handOff(model, g, lim)
	return nil, err
}

// Queued returns the number of requests waiting for model.
func (c *Controller) Queued(model string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.models[model]; g != nil {
		return g.waiters.len()
	}
	return 0
}

// InFlight returns the admitted requests of model.
func (c *Controller) InFlight(model string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.models[model]; g != nil {
		return g.inFlight
	}
	return 0
}

func (c *Controller) releaser(model string, lim policy.Limits) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.handOff(model, c.models[model], lim)
		})
	}
}

// handOff frees one slot and passes free slots to the next waiters.
// Caller holds c.mu.
func (c *Controller) handOff(model string, g *gate, lim policy.Limits) {
	g.inFlight--
	c.fill(model, g, lim)
}

// fill admits waiters while there is room (limits may have grown since they
// queued). Caller holds c.mu.
func (c *Controller) fill(model string, g *gate, lim policy.Limits) {
	n := g.waiters.len()
	for g.waiters.len() > 0 && (lim.MaxInFlight <= 0 || g.inFlight < c.capOf(model, lim)) {
		g.inFlight++
		close(g.waiters.pop().ch)
	}
	if g.waiters.len() != n {
		c.queued(model, g)
	}
}

func (c *Controller) queued(model string, g *gate) {
	if c.OnQueue != nil {
		c.OnQueue(model, g.waiters.len())
	}
}

// capOf is the in-flight cap this router applies to model: lim's, or its
// share of it (Share). Caller holds c.mu.
// Cap is the in-flight cap this router enforces for model now: the policy's
// max_in_flight, or with router/peers this router's share of it (0: none).
func (c *Controller) Cap(model string, lim policy.Limits) int { return c.capOf(model, lim) }

func (c *Controller) capOf(model string, lim policy.Limits) int {
	if lim.MaxInFlight <= 0 || c.Share == nil {
		return lim.MaxInFlight
	}
	return c.Share(model, lim.MaxInFlight)
}

// Refill admits waiters of every model whose share has grown since they
// queued (call it when the peers' loads change).
func (c *Controller) Refill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for model, g := range c.models {
		if g.waiters.len() > 0 {
			c.fill(model, g, g.lim)
		}
	}
}

// Loads are the in-flight and queued requests of every model with a cap
// (the load told to the datacenter's other routers).
func (c *Controller) Loads() map[string]Load {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Load, len(c.models))
	for model, g := range c.models {
		if g.lim.MaxInFlight > 0 {
			out[model] = Load{InFlight: g.inFlight, Queued: g.waiters.len(), Band: g.waiters.top()}
		}
	}
	return out
}
