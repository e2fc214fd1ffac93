package envelope

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestDecodeNamesNonEnvelopeText: a value without a content-type header
// that is neither a JSON object nor Protobuf is reported as such, with its
// start, not as a bad Protobuf envelope.
func TestDecodeNamesNonEnvelopeText(t *testing.T) {
	for _, v := range []string{"hello, world", "[1,2,3]", `"just a string"`, "42"} {
		_, err := Decode(kafka.Message{Value: []byte(v)})
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "neither a JSON object nor Protobuf") || !strings.Contains(err.Error(), strconv.Quote(v)) {
			t.Errorf("Decode(%q) = %v", v, err)
		}
	}
	_, err := Decode(kafka.Message{Value: []byte{0xff, 0xff, 0xff}, Headers: []kafka.Header{{Key: HeaderContentType, Value: []byte(ContentTypeProto)}}})
	if err == nil || !strings.Contains(err.Error(), "not a Protobuf envelope") {
		t.Errorf("bad Protobuf with its content-type: %v", err)
	}
}
