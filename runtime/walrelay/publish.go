package walrelay

import (
	"context"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/internal/faults"
	"github.com/protoevents/protoevents/runtime/internal/health"
	"github.com/protoevents/protoevents/runtime/internal/kafkawriter"
)

// publisher is one lane: it sends its shares of the transactions to Kafka
// in commit order, one produce call at a time, and acknowledges each
// transaction whose last share it published. A failed call is sent again,
// whole, with backoff, for ever: nothing is skipped, so a record the
// brokers keep refusing (a topic that does not exist) holds its lane and,
// once the others wait for it, the slot; /readyz and the log say why.
type publisher struct {
	r  *Relay
	w  *kafka.Writer
	wm *watermark
	in <-chan part
	// stop asks for a graceful end: publish what is queued, then return.
	// The context given to run ends the call in flight too.
	stop <-chan struct{}
	// points are the test-only fault points (runtime/faultinject); crash
	// ends the session when one fires.
	points faults.WALRelay
	crash  func(error)
}

func (p *publisher) run(ctx context.Context) {
	var batch []part
	var msgs []kafka.Message
	stopping := false
	for {
		batch, msgs = batch[:0], msgs[:0]
		if stopping {
			// The stream has stopped handing over: publish what is
			// queued (so no transaction stays half published by the
			// lanes), then return.
			select {
			case t := <-p.in:
				batch, msgs = append(batch, t), append(msgs, t.msgs...)
			default:
				return
			}
		} else {
			select {
			case t := <-p.in:
				batch, msgs = append(batch, t), append(msgs, t.msgs...)
			case <-p.stop:
				stopping = true
				continue
			case <-ctx.Done():
				return
			}
		}
		size := 0
		for i := range msgs {
			size += kafkawriter.Size(&msgs[i])
		}
	fill:
		for len(msgs) < p.r.cfg.batchSize && size < kafkawriter.MaxBatchBytes {
			select {
			case t := <-p.in:
				batch, msgs = append(batch, t), append(msgs, t.msgs...)
				for i := range t.msgs {
					size += kafkawriter.Size(&t.msgs[i])
				}
			default:
				break fill
			}
		}
		if !p.send(ctx, msgs) {
			return
		}
		if f := p.points.AfterPublish; f != nil {
			if err := f(ctx, len(msgs)); err != nil {
				p.crash(err)
				return
			}
		}
		for _, pt := range batch {
			if pt.t.parts.Add(-1) == 0 {
				p.wm.ack(pt.t)
			}
		}
		p.r.state.published(len(msgs))
		if f := p.r.cfg.hooks.Published; f != nil {
			f(len(msgs))
		}
		clear(batch)
	}
}

// send produces msgs until the brokers acknowledge them all; false when
// ctx ended first.
func (p *publisher) send(ctx context.Context, msgs []kafka.Message) bool {
	// kafka-go reserves BatchSize messages per partition batch: sized to
	// the call (docs/design.md, "The trickle path").
	p.w.BatchSize = max(1, len(msgs))
	backoff := p.r.cfg.publishRetryMin
	for {
		back := p.r.kafkaWatch.Back()
		err := p.w.WriteMessages(ctx, msgs...)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		p.r.state.failed(err)
		if f := p.r.cfg.hooks.PublishFailed; f != nil {
			f(err)
		}
		p.r.cfg.log.Warn("walrelay: publish failed; sending the batch again", "records", len(msgs), "retry_in", backoff, "err", err)
		// The brokers' check looks at once, then often while they are
		// unreachable; seeing them back, it ends this sleep.
		p.r.kafkaWatch.Suspect()
		if health.Sleep(ctx, backoff, back) != nil {
			return false
		}
		backoff = min(2*backoff, p.r.cfg.publishRetryMax)
	}
}
