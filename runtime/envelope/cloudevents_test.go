package envelope_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/protoevents/protoevents/eventstest"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

func TestMain(m *testing.M) { eventstest.Main(m) }

// kafkaMessage adapts a kafka-go message to the CloudEvents SDK's
// binding.Message, following the CloudEvents Kafka protocol binding (the
// SDK's own kafka_sarama binding does the same over sarama's types): a
// content-type the SDK knows as an event format (application/cloudevents+json)
// is structured mode, a ce_specversion header is binary mode with ce_*
// headers as attributes and extensions and content-type as datacontenttype.
// It only moves bytes: the SDK parses and validates them.
type kafkaMessage struct {
	value       []byte
	headers     map[string]string
	contentType string
	version     spec.Version
	format      format.Format
}

var ceSpecs = spec.WithPrefix("ce_")

func newKafkaMessage(m kafka.Message) *kafkaMessage {
	km := &kafkaMessage{value: m.Value, headers: map[string]string{}}
	for _, h := range m.Headers {
		km.headers[strings.ToLower(h.Key)] = string(h.Value)
	}
	km.contentType = km.headers["content-type"]
	if f := format.Lookup(km.contentType); f != nil {
		km.format = f
	} else if v, ok := km.headers[ceSpecs.PrefixedSpecVersionName()]; ok {
		km.version = ceSpecs.Version(v)
	}
	return km
}

func (m *kafkaMessage) ReadEncoding() binding.Encoding {
	switch {
	case m.version != nil:
		return binding.EncodingBinary
	case m.format != nil:
		return binding.EncodingStructured
	}
	return binding.EncodingUnknown
}

func (m *kafkaMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.format == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.value))
}

func (m *kafkaMessage) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.headers {
		var err error
		switch {
		case k == "content-type":
			err = w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), v)
		case strings.HasPrefix(k, ceSpecs.Prefix()):
			if attr := m.version.Attribute(k); attr != nil {
				err = w.SetAttribute(attr, v)
			} else {
				err = w.SetExtension(strings.TrimPrefix(k, ceSpecs.Prefix()), v)
			}
		}
		if err != nil {
			return err
		}
	}
	if len(m.value) > 0 {
		return w.SetData(bytes.NewReader(m.value))
	}
	return nil
}

func (m *kafkaMessage) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		return attr, m.contentType
	}
	if v, ok := m.headers[attr.PrefixedName()]; ok {
		return attr, v
	}
	return attr, nil
}

func (m *kafkaMessage) GetExtension(name string) interface{} {
	if v, ok := m.headers[ceSpecs.Prefix()+name]; ok {
		return v
	}
	return nil
}

func (m *kafkaMessage) Finish(error) error { return nil }

// TestCloudEventsSDKReadsRelayedRecords: records the relay published, in
// every wire format, are valid CloudEvents for the official Go SDK (binary
// content mode of the Kafka binding), with our metadata in the standard
// attributes and extensions; in the CloudEvents formats the data is the
// payload alone.
func TestCloudEventsSDKReadsRelayedRecords(t *testing.T) {
	for _, f := range envelope.Formats {
		t.Run(f.String(), func(t *testing.T) {
			env := eventstest.New(t, eventstest.WithOwnKafka(), eventstest.WithFormat(f))
			sent := &ordersv1.OrderPlaced{OrderId: "o-1", CustomerId: "c-7", TotalCents: 4200, Currency: "EUR", Country: "DE",
				Items: []*ordersv1.LineItem{{Sku: "sku-1", Quantity: 2}}}
			id := env.Produce(t, sent, events.WithCorrelationID("req-42"), events.WithCausationID("01JDQ2X7Y4Z8KQ3B6M9T5V0W1R"),
				events.WithTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
			env.Relay(t)

			r := kafka.NewReader(kafka.ReaderConfig{Brokers: env.Brokers, Topic: ordersv1.OrderPlacedTopic, Partition: partitionOf(t, env, "o-1"), MaxWait: 50 * time.Millisecond})
			defer r.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d bytes per record (key %d, value %d, headers %d)", f, recordBytes(m), len(m.Key), len(m.Value), recordBytes(m)-len(m.Key)-len(m.Value))

			msg := newKafkaMessage(m)
			if enc := msg.ReadEncoding(); enc != binding.EncodingBinary {
				t.Fatalf("SDK encoding %v, want binary", enc)
			}
			ev, err := binding.ToEvent(ctx, msg)
			if err != nil {
				t.Fatalf("the CloudEvents SDK rejects the record: %v", err)
			}
			if err := ev.Validate(); err != nil {
				t.Fatalf("the CloudEvents SDK finds the event invalid: %v", err)
			}
			t.Logf("SDK: %s", strings.ReplaceAll(ev.String(), "\n", " | "))
			if ev.SpecVersion() != cloudevents.VersionV1 || ev.ID() != id.String() || ev.Type() != ordersv1.OrderPlacedEventType || ev.Source() != "orders" || ev.Time().IsZero() {
				t.Errorf("attributes: specversion %q id %q type %q source %q time %v", ev.SpecVersion(), ev.ID(), ev.Type(), ev.Source(), ev.Time())
			}
			ext := ev.Extensions()
			if ext["schemaversion"] != "1" || ext["correlationid"] != "req-42" || ext["causationid"] != "01JDQ2X7Y4Z8KQ3B6M9T5V0W1R" {
				t.Errorf("extensions %v, want schemaversion 1, correlationid req-42, causationid", ext)
			}
			if ev.DataContentType() != f.ContentType() {
				t.Errorf("datacontenttype %q, want %q", ev.DataContentType(), f.ContentType())
			}
			var got ordersv1.OrderPlaced
			switch f {
			case envelope.FormatCloudEventsJSON:
				err = protojson.Unmarshal(ev.Data(), &got)
			case envelope.FormatCloudEventsProto:
				err = proto.Unmarshal(ev.Data(), &got)
			default:
				// The envelope formats carry the whole envelope as data.
				var dec *envelope.Envelope
				if dec, err = envelope.Decode(kafka.Message{Value: ev.Data(), Headers: []kafka.Header{{Key: envelope.HeaderContentType, Value: []byte(ev.DataContentType())}}}); err == nil {
					err = dec.UnmarshalPayload(&got)
				}
			}
			if err != nil || !proto.Equal(&got, sent) {
				t.Errorf("data decodes to %v (%v), want %v", &got, err, sent)
			}
		})
	}
}

// partitionOf returns the partition the relay sent key to (kafka-go's hash
// balancer over the topic's partitions), found by reading every partition's
// end offset.
func partitionOf(t *testing.T, env *eventstest.Env, key string) int {
	t.Helper()
	conn, err := kafka.Dial("tcp", env.Brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	parts, err := conn.ReadPartitions(ordersv1.OrderPlacedTopic)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		c, err := kafka.DialLeader(context.Background(), "tcp", env.Brokers[0], p.Topic, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		last, err := c.ReadLastOffset()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if last > 0 {
			return p.ID
		}
	}
	t.Fatalf("no partition of %s holds %s", ordersv1.OrderPlacedTopic, key)
	return 0
}

// recordBytes is the size of a record's key, value and headers.
func recordBytes(m kafka.Message) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}
