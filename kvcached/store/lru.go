package store

// lruLinks is an element's place in an lruList; elements embed it.
type lruLinks[T any] struct{ prev, next *T }

// lruElem is a pointer to an element that embeds lruLinks.
type lruElem[T any] interface {
	*T
	links() *lruLinks[T]
}

// lruList is an intrusive doubly linked list, most recently used at head:
// the RAM tier's items and the disk tier's entries. The zero value is empty.
type lruList[T any, P lruElem[T]] struct{ head, tail P }

func (l *lruList[T, P]) pushFront(e P) {
	le := e.links()
	le.prev, le.next = nil, l.head
	if l.head != nil {
		l.head.links().prev = e
	}
	l.head = e
	if l.tail == nil {
		l.tail = e
	}
}

func (l *lruList[T, P]) unlink(e P) {
	le := e.links()
	if le.prev != nil {
		P(le.prev).links().next = le.next
	} else {
		l.head = le.next
	}
	if le.next != nil {
		P(le.next).links().prev = le.prev
	} else {
		l.tail = le.prev
	}
	le.prev, le.next = nil, nil
}
