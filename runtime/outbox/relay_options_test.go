package outbox

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"

	"github.com/protoevents/protoevents/runtime/internal/kafkawriter"
)

// TestRelayProducerOptions: the producer options reach every worker's
// kafka-go Writer on one shared transport, out-of-range values are refused
// with an "outbox: " error, and the settings the guarantees rest on hold.
// No database or broker is needed: the pool connects lazily.
func TestRelayProducerOptions(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	brokers := []string{"127.0.0.1:9092"}

	for _, o := range []RelayOption{WithWriteTimeout(0), WithMaxAttempts(0), WithMaxAttempts(101)} {
		if _, err := NewRelay(pool, brokers, o); err == nil || !strings.HasPrefix(err.Error(), "outbox: ") {
			t.Errorf("out-of-range option: %v, want an outbox: error", err)
		}
	}

	r, err := NewRelay(pool, brokers)
	if err != nil {
		t.Fatal(err)
	}
	if tr := r.newTransport(); tr == nil || tr.TLS != nil || tr.SASL != nil || tr.MetadataTTL != kafkawriter.MetadataTTL {
		t.Fatalf("transport without TLS or SASL: %+v, want the relay's own, metadata every %v", tr, kafkawriter.MetadataTTL)
	}
	w := r.newKafkaWriter(nil)
	if w.Transport != nil || w.WriteTimeout != 10*time.Second || w.MaxAttempts != 3 {
		t.Fatalf("default writer: transport %v, write timeout %v, attempts %d", w.Transport, w.WriteTimeout, w.MaxAttempts)
	}

	tc := &tls.Config{ServerName: "kafka"}
	mech := plain.Mechanism{Username: "u", Password: "p"}
	r, err = NewRelay(pool, brokers, WithTLS(tc), WithSASL(mech), WithWriteTimeout(time.Minute), WithMaxAttempts(1), WithBatchSize(200))
	if err != nil {
		t.Fatal(err)
	}
	tr := r.newTransport()
	if tr == nil || tr.TLS != tc || tr.SASL != mech {
		t.Fatalf("transport %+v, want the TLS config and SASL mechanism given", tr)
	}
	w = r.newKafkaWriter(tr)
	if w.Transport != tr || w.WriteTimeout != time.Minute || w.MaxAttempts != 1 {
		t.Fatalf("writer: transport %v, write timeout %v, attempts %d", w.Transport, w.WriteTimeout, w.MaxAttempts)
	}
	if w.RequiredAcks != kafka.RequireAll || w.Async || w.Topic != "" || w.BatchSize != 200 || w.BatchBytes < 1<<30 ||
		w.BatchTimeout != time.Nanosecond {
		t.Fatalf("writer settings the guarantees rest on: %+v", w)
	}
	if g, ok := w.Balancer.(*kafkawriter.Guard); !ok || g != r.guard {
		t.Fatalf("balancer %T, want the relay's one kafkawriter.Guard (murmur2, shared by its writers)", w.Balancer)
	}
}
