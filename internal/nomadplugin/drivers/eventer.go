package drivers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ErrEventerClosed is returned by an Eventer whose context has ended.
var ErrEventerClosed = errors.New("eventer closed")

const (
	// eventBuffer is how many events a subscriber may fall behind.
	eventBuffer = 64
	// eventSendTimeout bounds the wait for a subscriber with a full buffer;
	// the event is then dropped for that subscriber (and logged).
	eventSendTimeout = time.Second
)

// Eventer fans task events out to every TaskEvents subscriber (the Nomad
// client keeps one stream open). Each subscriber has a bounded buffer; a
// subscriber that stays full for a second loses the event rather than
// stalling the driver. Subscriptions end with their context or the
// Eventer's.
type Eventer struct {
	ctx    context.Context
	logger hclog.Logger

	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

type subscriber struct {
	ctx context.Context
	ch  chan *TaskEvent
}

// NewEventer returns an Eventer that ends with ctx; a nil logger discards.
func NewEventer(ctx context.Context, logger hclog.Logger) *Eventer {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Eventer{ctx: ctx, logger: logger, subs: map[*subscriber]struct{}{}}
}

// TaskEvents subscribes until ctx (or the Eventer) ends; the channel is
// closed then.
func (e *Eventer) TaskEvents(ctx context.Context) (<-chan *TaskEvent, error) {
	if e.ctx.Err() != nil {
		return nil, ErrEventerClosed
	}
	s := &subscriber{ctx: ctx, ch: make(chan *TaskEvent, eventBuffer)}
	e.mu.Lock()
	e.subs[s] = struct{}{}
	e.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-e.ctx.Done():
		}
		e.mu.Lock()
		delete(e.subs, s)
		close(s.ch)
		e.mu.Unlock()
	}()
	return s.ch, nil
}

// EmitEvent delivers ev to every current subscriber.
func (e *Eventer) EmitEvent(ev *TaskEvent) error {
	if e.ctx.Err() != nil {
		return ErrEventerClosed
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var timer *time.Timer
	for s := range e.subs {
		select {
		case s.ch <- ev:
			continue
		default:
		}
		if timer == nil {
			timer = time.NewTimer(eventSendTimeout)
			defer timer.Stop()
		}
		select {
		case s.ch <- ev:
		case <-s.ctx.Done():
		case <-e.ctx.Done():
			return ErrEventerClosed
		case <-timer.C:
			e.logger.Warn("task event subscriber is not reading; event dropped", "task_id", ev.TaskID, "message", ev.Message)
		}
	}
	return nil
}
