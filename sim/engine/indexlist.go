package engine

// indexList is a doubly linked list of slots named by index: the block pool's
// free queue and an offload tier's LRU order. Its links live beside the
// slots, in a slice that grows with them, so the slots' own arrays stay
// plain values.
type indexList struct {
	links      []indexLink // by slot
	head, tail int32       // noBlock when empty
}

type indexLink struct{ prev, next int32 }

func newIndexList() indexList { return indexList{head: noBlock, tail: noBlock} }

// grow adds a slot, not in the list, at index len(links).
func (l *indexList) grow() { l.links = append(l.links, indexLink{noBlock, noBlock}) }

func (l *indexList) pushTail(i int32) {
	l.links[i] = indexLink{prev: l.tail, next: noBlock}
	if l.tail != noBlock {
		l.links[l.tail].next = i
	} else {
		l.head = i
	}
	l.tail = i
}

func (l *indexList) unlink(i int32) {
	k := l.links[i]
	if k.prev != noBlock {
		l.links[k.prev].next = k.next
	} else {
		l.head = k.next
	}
	if k.next != noBlock {
		l.links[k.next].prev = k.prev
	} else {
		l.tail = k.prev
	}
	l.links[i] = indexLink{noBlock, noBlock}
}
