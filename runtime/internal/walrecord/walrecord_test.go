package walrecord

import (
	"bytes"
	"errors"
	"testing"

	"github.com/segmentio/kafka-go"
)

func TestRoundTrip(t *testing.T) {
	for _, r := range []Record{
		{Topic: "shop.orders.v1", Key: []byte("o-1"), Value: []byte(`{"a":1}`),
			Headers: []kafka.Header{{Key: "ce_id", Value: []byte("01J")}, {Key: "empty", Value: nil}}},
		{Topic: "t", Key: []byte{0}, Value: nil},
		{Topic: "t", Key: bytes.Repeat([]byte("k"), 300), Value: bytes.Repeat([]byte("v"), 70000)},
	} {
		b := Append(nil, r)
		if len(b) != Size(r) {
			t.Fatalf("Size = %d, encoded %d bytes", Size(r), len(b))
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Topic != r.Topic || !bytes.Equal(got.Key, r.Key) || !bytes.Equal(got.Value, r.Value) || len(got.Headers) != len(r.Headers) {
			t.Fatalf("round trip: got %+v, want %+v", got, r)
		}
		for i, h := range r.Headers {
			if got.Headers[i].Key != h.Key || !bytes.Equal(got.Headers[i].Value, h.Value) {
				t.Fatalf("header %d: got %+v, want %+v", i, got.Headers[i], h)
			}
		}
	}
}

func TestDecodeRefusesWhatItCannotRead(t *testing.T) {
	good := Append(nil, Record{Topic: "t", Key: []byte("k"), Headers: []kafka.Header{{Key: "h", Value: []byte("v")}}, Value: []byte("x")})
	for name, b := range map[string][]byte{
		"empty":       nil,
		"not ours":    []byte("{}"),
		"new version": {magic, version + 1},
		"cut topic":   good[:3],
		"cut header":  good[:9],
		"huge count":  {magic, version, 1, 't', 1, 'k', 0xff, 0xff, 0x03},
	} {
		if _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Decode(%q) = %v, want ErrMalformed", name, b, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Append(nil, Record{Topic: "t", Key: []byte("k"), Headers: []kafka.Header{{Key: "a", Value: []byte("b")}}, Value: []byte("v")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			return
		}
		// Lengths may be written in longer varints than Append writes; the
		// record they decode to must survive a round trip.
		again, err := Decode(Append(nil, r))
		if err != nil {
			t.Fatalf("re-encoded record %+v does not decode: %v", r, err)
		}
		if again.Topic != r.Topic || !bytes.Equal(again.Key, r.Key) || !bytes.Equal(again.Value, r.Value) || len(again.Headers) != len(r.Headers) {
			t.Fatalf("round trip changed %+v into %+v", r, again)
		}
	})
}
