package host

import (
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/workerref"
)

// Recording a decision in the predicted index costs a map insert and a
// heap push per prompt block (tens of microseconds for 2,048 tokens), so it
// runs off the request path on one goroutine per model. When that
// goroutine falls behind by predQueue decisions, the request records
// inline instead: the predicted index must not drop decisions. While a
// request is active the scheduler itself counts its booked prefix as
// cached (scheduler.BookedPrefixCounter), which is what keeps siblings
// arriving within the goroutine's lag together; the predicted index serves
// the peers' decisions, the policies that do not count booked prefixes,
// and a request that ended before its Stored events arrived.

const predQueue = 4096

type predRecord struct {
	key    workerref.Target
	hashes *[]kvevents.SeqHash
	at     time.Time
}

var hashPool = sync.Pool{New: func() any { s := make([]kvevents.SeqHash, 0, 256); return &s }}

// recordPredicted queues (or, when the queue is full, applies) one routing
// decision in the model's predicted index.
func (ms *modelState) recordPredicted(k workerref.Target, hashes []kvevents.SeqHash, at time.Time) {
	if ms.pred == nil || len(hashes) == 0 {
		return
	}
	hp := hashPool.Get().(*[]kvevents.SeqHash)
	*hp = append((*hp)[:0], hashes...)
	select {
	case ms.predCh <- predRecord{key: k, hashes: hp, at: at}:
	default:
		ms.pred.Record(k, *hp, at)
		hashPool.Put(hp)
	}
}

// predLoop applies queued decisions until stop closes.
func (ms *modelState) predLoop(stop <-chan struct{}) {
	for {
		select {
		case rec := <-ms.predCh:
			ms.pred.Record(rec.key, *rec.hashes, rec.at)
			if cap(*rec.hashes) <= 1<<16 {
				hashPool.Put(rec.hashes)
			}
		case <-stop:
			return
		}
	}
}
