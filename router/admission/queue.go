package admission

import (
	"context"
	"sort"
)

// Class is who a request is for: its tenant (an API key id) and its
// priority band. The queue serves higher bands first and, within a band,
// tenants in turn (each tenant's own requests in arrival order), so that
// no tenant starves the others of its band at saturation.
type Class struct {
	Tenant   string
	Priority int // higher is served first; 0 by default
}

type classKey struct{}

// WithClass returns ctx carrying c for Acquire.
func WithClass(ctx context.Context, c Class) context.Context {
	return context.WithValue(ctx, classKey{}, c)
}

// classOf is ctx's Class, or the zero Class (tenant "", band 0).
func classOf(ctx context.Context) Class {
	c, _ := ctx.Value(classKey{}).(Class)
	return c
}

// waiter is one queued request; ch is closed when it is handed a slot.
type waiter struct {
	ch    chan struct{}
	class Class
}

// queue holds a model's waiting requests by band and tenant.
type queue struct {
	n     int
	bands []*band // by priority, highest first
}

// band is one priority's waiters: per tenant a FIFO, tenants served in
// turn (ring order of their first arrival; a tenant with none left goes).
type band struct {
	priority int
	tenants  map[string][]*waiter
	ring     []string
	next     int
}

func (q *queue) len() int { return q.n }

// top is the highest band with a waiter (0 when none wait).
func (q *queue) top() int {
	if q.n == 0 {
		return 0
	}
	return q.bands[0].priority
}

func (q *queue) push(w *waiter) {
	i := sort.Search(len(q.bands), func(i int) bool { return q.bands[i].priority <= w.class.Priority })
	if i == len(q.bands) || q.bands[i].priority != w.class.Priority {
		b := &band{priority: w.class.Priority, tenants: map[string][]*waiter{}}
		q.bands = append(q.bands, nil)
		copy(q.bands[i+1:], q.bands[i:])
		q.bands[i] = b
	}
	b := q.bands[i]
	if _, ok := b.tenants[w.class.Tenant]; !ok {
		b.ring = append(b.ring, w.class.Tenant)
	}
	b.tenants[w.class.Tenant] = append(b.tenants[w.class.Tenant], w)
	q.n++
}

// pop takes the next waiter: the highest band's next tenant's oldest.
func (q *queue) pop() *waiter {
	if q.n == 0 {
		return nil
	}
	b := q.bands[0]
	b.next %= len(b.ring)
	t := b.ring[b.next]
	w := b.tenants[t][0]
	q.take(b, b.next, 0)
	return w
}

// remove takes w out (it gave up); false when it is not queued.
func (q *queue) remove(w *waiter) bool {
	for _, b := range q.bands {
		if b.priority != w.class.Priority {
			continue
		}
		ws := b.tenants[w.class.Tenant]
		for i, x := range ws {
			if x == w {
				q.take(b, ringIndex(b.ring, w.class.Tenant), i)
				return true
			}
		}
	}
	return false
}

// take removes the waiter at i of the tenant at ring index r of b, moving
// the turn past that tenant when it was the one served.
func (q *queue) take(b *band, r, i int) {
	t := b.ring[r]
	ws := b.tenants[t]
	b.tenants[t] = append(ws[:i], ws[i+1:]...)
	q.n--
	served := r == b.next%len(b.ring) && i == 0
	if len(b.tenants[t]) == 0 {
		delete(b.tenants, t)
		b.ring = append(b.ring[:r], b.ring[r+1:]...)
		if r < b.next {
			b.next--
		}
	} else if served {
		b.next = r + 1
	}
	if len(b.ring) == 0 {
		q.dropBand(b)
	} else {
		b.next %= len(b.ring)
	}
}

func (q *queue) dropBand(b *band) {
	for i, x := range q.bands {
		if x == b {
			q.bands = append(q.bands[:i], q.bands[i+1:]...)
			return
		}
	}
}

func ringIndex(ring []string, t string) int {
	for i, x := range ring {
		if x == t {
			return i
		}
	}
	return -1
}
