package peers

// claim is one live router's part in a split: its demand and, when its
// load is known (fresh), what it uses now.
type claim struct {
	name   string
	demand float64 // in flight + queued (a model), requests/s (a key)
	known  bool    // a fresh load from the router itself
	used   int     // in flight, when known
	share  int     // its part as it last said, when known
	// waiting: requests wait in its queue, the highest of them in band.
	waiting bool
	band    int
	// demoted: its queue's highest band is below the highest waiting
	// anywhere (byBand): no part by demand at all.
	demoted bool
}

// byBand gives the cap to the highest priority waiting: when requests wait
// at several routers, a router whose queue's highest band is below the
// highest band waiting anywhere claims no demand (neither the slot each
// router with work gets first nor any part of the rest: allocate weighs
// it 0, not 1 + demand), so the slots it frees go to the routers holding
// the higher band, as one router's own queue serves bands in order. Its
// requests in flight still count as held (shareOf): a slot moves only once
// freed. Routers with nothing queued keep their demand. cs is changed in
// place and returned.
func byBand(cs []claim) []claim {
	top, found := 0, false
	for _, c := range cs {
		if c.known && c.waiting && (!found || c.band > top) {
			top, found = c.band, true
		}
	}
	for i, c := range cs {
		if found && c.known && c.waiting && c.band < top {
			cs[i].demand, cs[i].demoted = 0, true
		}
	}
	return cs
}

// allocate splits total slots over claims (sorted by name): first one slot
// to each claim with demand, in name order, while slots remain, so that no
// router with work waits for ever behind a busier one; then the rest in
// proportion to 1 + demand (0 for a claim byBand demoted), by largest
// remainder (ties to the earlier name). Routers that see the same claims compute the same split, which
// sums to total.
func allocate(total int, cs []claim) []int {
	out := make([]int, len(cs))
	left := total
	for i, c := range cs {
		if left == 0 {
			break
		}
		if c.demand > 0 {
			out[i]++
			left--
		}
	}
	if left == 0 || len(cs) == 0 {
		return out
	}
	var sum float64
	for _, c := range cs {
		sum += c.weight()
	}
	if sum == 0 {
		return out
	}
	rems := make([]float64, len(cs))
	given := 0
	for i, c := range cs {
		exact := float64(left) * c.weight() / sum
		n := int(exact)
		out[i] += n
		given += n
		rems[i] = exact - float64(n)
	}
	// Fewer slots remain than claims: each goes to the largest remainder
	// not yet served, the earlier name on a tie.
	for ; given < left; given++ {
		best := 0
		for i, r := range rems {
			if r > rems[best] {
				best = i
			}
		}
		out[best]++
		rems[best] = -1
	}
	return out
}

// shareOf is the slots of total the router at self may fill: its part of
// allocate's split, and never more than total less, for each other router,
// the largest of what it said it runs, what it said its part was, and its
// part now. A router whose load is unknown (cut off, or silent for
// StaleAfter) is taken to hold at least its even part (total ÷ routers): a
// router cut off from its peers falls back to that share, never more. A
// slot moves from one router to another only once its holder has said it
// gave it up.
func shareOf(total int, self int, cs []claim) int {
	if total <= 0 {
		return total
	}
	alloc := allocate(total, cs)
	even := allocate(total, make([]claim, len(cs)))
	others := 0
	for i, c := range cs {
		if i == self {
			continue
		}
		if c.known {
			others += max(c.used, c.share, alloc[i])
		} else {
			others += max(alloc[i], even[i])
		}
	}
	return max(0, min(alloc[self], total-others))
}

// weight is c's claim on the slots left after the first ones: 1 + demand,
// or 0 when demoted (byBand).
func (c claim) weight() float64 {
	if c.demoted {
		return 0
	}
	return 1 + c.demand
}

// fractionOf is self's part of a rate: (1 + demand) over the sum of
// everyone's.
func fractionOf(self int, cs []claim) float64 {
	var sum float64
	for _, c := range cs {
		sum += 1 + c.demand
	}
	if sum == 0 || self < 0 || self >= len(cs) {
		return 1
	}
	return (1 + cs[self].demand) / sum
}
