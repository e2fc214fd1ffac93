package outbox

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/segmentio/kafka-go"
)

// FuzzHeadersRoundTrip: whatever text headers hold, decodeHeaders gives
// back what encodeHeaders stored, the hand-written encoding is JSON that
// encoding/json reads the same way, and the hand-written scan of
// Postgres's spacing agrees with encoding/json.
func FuzzHeadersRoundTrip(f *testing.F) {
	f.Add("ce_type", "shop.orders.v1.OrderPlaced", "traceparent", "")
	f.Add("quote\"d", "back\\slash", "ctl\x01\n\t\r", "unicode é ✓ \u2028")
	f.Add("", "", "<html>&", "\x7f")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		hs := []kafka.Header{{Key: k1, Value: []byte(v1)}, {Key: k2, Value: []byte(v2)}}
		enc, err := encodeHeaders(hs)
		if err != nil {
			return // not UTF-8: refused, as it should be
		}
		var pairs [][2]string
		if err := json.Unmarshal([]byte(enc), &pairs); err != nil {
			t.Fatalf("encoded headers %q are not JSON: %v", enc, err)
		}
		if want := [][2]string{{k1, v1}, {k2, v2}}; !reflect.DeepEqual(pairs, want) {
			t.Fatalf("encoding/json reads %q as %q, want %q", enc, pairs, want)
		}
		got, err := decodeHeaders(enc)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, hs) {
			t.Fatalf("round trip of %q: %q", enc, got)
		}
		// Postgres prints jsonb with a space after each comma.
		pretty, _ := json.MarshalIndent(pairs, "", " ")
		got, err = decodeHeaders(string(pretty))
		if err != nil || !reflect.DeepEqual(got, hs) {
			t.Fatalf("decoding %q: %q, %v", pretty, got, err)
		}
	})
}

// TestDecodeHeadersShapes: the scan takes Postgres's jsonb text and empty
// arrays, and malformed text is an error rather than a guess.
func TestDecodeHeadersShapes(t *testing.T) {
	for _, s := range []string{`[]`, ` [ ] `, `[["a", "b"], ["c", "d"]]`, `[["a","b"]]`} {
		if _, ok := scanHeaders(s); !ok {
			t.Errorf("scanHeaders refused %q", s)
		}
		if _, err := decodeHeaders(s); err != nil {
			t.Errorf("decodeHeaders(%q): %v", s, err)
		}
	}
	for _, s := range []string{``, `[`, `[["a", "b"]`, `[["a", "b"]] x`, `{"a": "b"}`, `[["a", 1]]`} {
		if _, err := decodeHeaders(s); err == nil {
			t.Errorf("decodeHeaders(%q) accepted malformed headers", s)
		}
	}
	hs, err := decodeHeaders(`[["k\u00e9", "a\"b"]]`)
	if err != nil || len(hs) != 1 || hs[0].Key != "ké" || string(hs[0].Value) != `a"b` {
		t.Errorf("escaped headers: %q, %v", hs, err)
	}
}
