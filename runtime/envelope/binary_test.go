package envelope

import (
	"errors"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/events"
)

// TestCloudEventsBinaryValueIsThePayload: in the CloudEvents formats the
// value is exactly the payload and the metadata lives in the headers only.
func TestCloudEventsBinaryValueIsThePayload(t *testing.T) {
	for _, f := range []Format{FormatCloudEventsJSON, FormatCloudEventsProto} {
		env, err := New(newTestEvent(t, "k"), events.PublishOptions{}, Options{Format: f})
		if err != nil {
			t.Fatal(err)
		}
		value, headers, err := env.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if string(value) != string(env.Payload) {
			t.Errorf("%s: value %q, want the payload %q", f, value, env.Payload)
		}
		m := kafka.Message{Key: env.Key, Value: value, Headers: headers}
		if ct, _ := Header(m, HeaderContentType); ct != f.ContentType() {
			t.Errorf("%s: content-type %q", f, ct)
		}
	}
}

// TestDecodeBinaryRefusesBadHeaders: a binary-mode record whose metadata
// headers are missing or malformed is malformed, never retried.
func TestDecodeBinaryRefusesBadHeaders(t *testing.T) {
	good := map[string]string{
		HeaderSpecVersion: "1.0", HeaderID: "01JDQ2X7Y4Z8KQ3B6M9T5V0W1R", HeaderType: "x.v1.Y", HeaderSource: "p",
		HeaderTime: "2026-12-02T10:00:00Z", HeaderSchemaVersion: "1", HeaderContentType: ContentTypePayloadJSON,
	}
	msg := func(drop, key, value string) kafka.Message {
		m := kafka.Message{Key: []byte("k"), Value: []byte(`{}`)}
		for k, v := range good {
			if k == drop {
				continue
			}
			if k == key {
				v = value
			}
			m.Headers = append(m.Headers, kafka.Header{Key: k, Value: []byte(v)})
		}
		return m
	}
	if env, err := Decode(msg("", "", "")); err != nil || env.Format != FormatCloudEventsJSON || env.Producer != "p" {
		t.Fatalf("good record: %v %+v", err, env)
	}
	for name, m := range map[string]kafka.Message{
		"no id":          msg(HeaderID, "", ""),
		"bad id":         msg("", HeaderID, "nope"),
		"no type":        msg(HeaderType, "", ""),
		"bad version":    msg("", HeaderSchemaVersion, "v1"),
		"no version":     msg(HeaderSchemaVersion, "", ""),
		"bad time":       msg("", HeaderTime, "yesterday"),
		"no time":        msg(HeaderTime, "", ""),
		"unknown format": msg("", HeaderContentType, "text/plain"),
	} {
		if _, err := Decode(m); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v, want ErrMalformed", name, err)
		}
	}
	// Without ce_specversion, application/json is still read as an envelope.
	m := msg(HeaderSpecVersion, "", "")
	if _, err := Decode(m); err == nil || !errors.Is(err, ErrMalformed) {
		t.Errorf("application/json without ce_specversion: %v, want an envelope decode error", err)
	}
}
