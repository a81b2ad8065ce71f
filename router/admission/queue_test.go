package admission

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/policy"
)

func TestQueueOrder(t *testing.T) {
	cases := []struct {
		name string
		in   []Class // pushed in this order
		want []string
	}{
		{"one tenant: arrival order", []Class{{"a", 0}, {"a", 0}, {"a", 0}}, []string{"a0", "a1", "a2"}},
		{"tenants of a band in turn", []Class{{"a", 0}, {"a", 0}, {"a", 0}, {"b", 0}, {"b", 0}},
			[]string{"a0", "b3", "a1", "b4", "a2"}},
		{"higher band first", []Class{{"low", 0}, {"low", 0}, {"high", 5}, {"mid", 1}},
			[]string{"high2", "mid3", "low0", "low1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var q queue
			names := map[*waiter]string{}
			for i, c := range tc.in {
				w := &waiter{class: c}
				names[w] = fmt.Sprintf("%s%d", c.Tenant, i)
				q.push(w)
			}
			var got []string
			for q.len() > 0 {
				got = append(got, names[q.pop()])
			}
			must.Eq(t, tc.want, got)
			must.Nil(t, q.pop())
		})
	}
}

func TestQueueRemoveKeepsTurns(t *testing.T) {
	var q queue
	a0, a1, b0, c0 := &waiter{class: Class{"a", 0}}, &waiter{class: Class{"a", 0}}, &waiter{class: Class{"b", 0}}, &waiter{class: Class{"c", 0}}
	for _, w := range []*waiter{a0, a1, b0, c0} {
		q.push(w)
	}
	must.True(t, q.remove(b0))
	must.False(t, q.remove(b0))
	must.Eq(t, a0, q.pop())
	must.Eq(t, c0, q.pop(), must.Sprint("b left: c's turn"))
	must.Eq(t, a1, q.pop())
	must.Eq(t, 0, q.len())
}

// At saturation two keys of a band get the slots in turn, whatever their
// arrival (a floods first), and a higher band is served before both.
func TestAcquireServesBandsAndTenantsFairly(t *testing.T) {
	c := New()
	lim := policy.Limits{MaxInFlight: 1, MaxQueue: 100, QueueTimeout: time.Minute}
	hold, err := c.AcquireSlot(context.Background(), "m", lim)
	must.NoError(t, err)
	order := make(chan string, 100)
	start := func(tenant string, prio int) {
		go func() {
			ctx := WithClass(context.Background(), Class{Tenant: tenant, Priority: prio})
			s, err := c.AcquireSlot(ctx, "m", lim)
			if err != nil {
				order <- "error"
				return
			}
			order <- tenant
			s.Release()
		}()
	}
	for range 10 {
		start("flood", 0)
	}
	testutil.Eventually(t, 5*time.Second, "the flood queued", func() bool { return c.Queued("m") == 10 })
	for range 5 {
		start("other", 0)
	}
	start("vip", 9)
	testutil.Eventually(t, 5*time.Second, "all queued", func() bool { return c.Queued("m") == 16 })
	must.Eq(t, Load{InFlight: 1, Queued: 16, Band: 9}, c.Loads()["m"], must.Sprint("the highest band queued, for the peers"))
	hold.Release()
	var got []string
	for range 16 {
		got = append(got, <-order)
	}
	must.Eq(t, "vip", got[0])
	counts := map[string]int{}
	for _, tnt := range got[1:11] {
		counts[tnt]++
	}
	must.Eq(t, map[string]int{"flood": 5, "other": 5}, counts, must.Sprintf("the first 10 after vip: in turn, got %v", got))
}
