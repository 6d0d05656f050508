package host

import "sync"

// mailbox is a bounded queue from many producers to one batching consumer
// (runBatches). A put wakes the consumer only for the first item of a
// batch and for a full one, not for each item as a channel send to a
// parked receiver does: a route shares two or three changes with its peers
// (booking add and free, its decision), and a goroutine wake-up for each
// cost more than the rest of sharing them.
type mailbox[T any] struct {
	mu    sync.Mutex
	items []T
	limit int           // items held at most; a put past it is refused
	full  int           // a batch this long wakes the consumer at once
	wake  chan struct{} // one pending signal at most
}

func newMailbox[T any](limit, full int) *mailbox[T] {
	return &mailbox[T]{limit: limit, full: full, wake: make(chan struct{}, 1)}
}

// put queues it; false when the mailbox holds limit items already.
func (m *mailbox[T]) put(it T) bool {
	m.mu.Lock()
	n := len(m.items)
	if n >= m.limit {
		m.mu.Unlock()
		return false
	}
	m.items = append(m.items, it)
	m.mu.Unlock()
	if n == 0 || n+1 == m.full {
		select {
		case m.wake <- struct{}{}:
		default: // a signal is pending already
		}
	}
	return true
}

// len is the number of items queued.
func (m *mailbox[T]) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.items)
}

// take returns the queued items and keeps spare (emptied) for the next
// ones, so that the two slices alternate without allocating.
func (m *mailbox[T]) take(spare []T) []T {
	clear(spare)
	m.mu.Lock()
	out := m.items
	m.items = spare[:0]
	m.mu.Unlock()
	return out
}
