package worker

import "time"

// ConnectFailed records a request that could not connect to the worker
// (refused, unroutable, dial timeout). From the after-th failure in a row
// the worker is ejected until now+d, and every further failure re-arms it,
// so an ejected worker gets one probe per d; after ≤ 0 never ejects. It
// reports whether this call ejected a worker that was not ejected at now.
func (l *Live) ConnectFailed(now time.Time, after int, d time.Duration) bool {
	n := l.unreachable.Add(1)
	if after <= 0 || int(n) < after {
		return false
	}
	prev := l.ejectedUntil.Swap(now.Add(d).UnixNano())
	return prev <= now.UnixNano()
}

// Connected records a request that reached the worker: the failure count
// restarts and an ejection ends.
func (l *Live) Connected() {
	if l.unreachable.Load() != 0 {
		l.unreachable.Store(0)
	}
	if l.ejectedUntil.Load() != 0 {
		l.ejectedUntil.Store(0)
	}
}

// Ejected reports whether the worker is ejected at now.
func (l *Live) Ejected(now time.Time) bool { return l.ejectedUntil.Load() > now.UnixNano() }
