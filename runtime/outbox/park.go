package outbox

import (
	"slices"
	"time"
)

type topicKey struct{ topic, key string }

// parkedKey is the backoff state of one failing key.
type parkedKey struct {
	until time.Time
	fails int
}

// maxParked bounds the parked-key memory; past it, parking is forgotten
// (which costs only extra retries).
const maxParked = 100000

// park holds the keys back for their next backoff delay.
func (l *loop) park(keys []topicKey) {
	if l.parked == nil || len(l.parked) > maxParked {
		l.parked = map[topicKey]*parkedKey{}
	}
	now := time.Now()
	for _, k := range keys {
		p := l.parked[k]
		if p == nil {
			p = &parkedKey{}
			l.parked[k] = p
		}
		b := backoff{min: l.r.cfg.backoffMin, max: l.r.cfg.backoffMax, n: p.fails}
		p.fails++
		p.until = now.Add(b.next())
	}
}

// parkTopics holds every row of the topics back for the topic's next
// backoff delay.
func (l *loop) parkTopics(topics []string) {
	if l.parkedTopics == nil || len(l.parkedTopics) > maxParked {
		l.parkedTopics = map[string]*parkedKey{}
	}
	now := time.Now()
	for _, t := range topics {
		p := l.parkedTopics[t]
		if p == nil {
			p = &parkedKey{}
			l.parkedTopics[t] = p
		}
		b := backoff{min: l.r.cfg.backoffMin, max: l.r.cfg.backoffMax, n: p.fails}
		p.fails++
		p.until = now.Add(b.next())
	}
}

// parkedNow returns the keys (as topic and key arrays) and the topics still
// parked, as claim parameters; never nil, since a NULL array would make
// the claim skip every row. Claims start at the head of the lanes, so a key
// whose backoff ended is claimed from its earliest pending row.
func (l *loop) parkedNow() (keyTopics []string, keys [][]byte, topics []string) {
	now := time.Now()
	keyTopics, keys, topics = []string{}, [][]byte{}, []string{}
	for k, p := range l.parked {
		if now.Before(p.until) {
			keyTopics = append(keyTopics, k.topic)
			keys = append(keys, []byte(k.key))
		}
	}
	for t, p := range l.parkedTopics {
		if now.Before(p.until) {
			topics = append(topics, t)
		}
	}
	return keyTopics, keys, topics
}

// failedIn reports whether a row's key or topic failed in the judged batch:
// its later rows, claimed while that batch was in flight, must wait.
func failedIn(out *outcome, c *claimed) bool {
	return slices.Contains(out.refusedTopics, c.Topic) ||
		slices.Contains(out.failing, topicKey{c.Topic, string(c.Key)})
}
