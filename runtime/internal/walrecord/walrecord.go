// Package walrecord encodes the Kafka record an outbox Writer emits as a
// logical decoding message (pg_logical_emit_message) for the WAL relay, and
// decodes it on the relay's side. The record is exactly what the relay
// sends: topic, key, headers and value, so the two relays publish the same
// bytes.
//
// Layout, version 1: the byte 'P', the byte 1, then uvarint-length-prefixed
// topic and key, a uvarint header count, each header as a
// length-prefixed key and value, and the value as the rest.
package walrecord

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
)

// Prefix is the logical decoding message prefix of outbox records: the WAL
// relay reads the messages with this prefix and no other.
const Prefix = "protoevents.outbox.v1"

// HeartbeatPrefix marks the relay's own non-transactional heartbeat
// messages, which carry nothing and only move the stream forward.
const HeartbeatPrefix = "protoevents.heartbeat"

const (
	magic   = 'P'
	version = 1
)

// Record is one event as the relay publishes it. Its headers are
// kafka-go's, so neither side converts them.
type Record struct {
	Topic   string
	Key     []byte
	Headers []kafka.Header
	Value   []byte
}

// Append encodes r onto b.
func Append(b []byte, r Record) []byte {
	b = append(b, magic, version)
	b = appendBytes(b, []byte(r.Topic))
	b = appendBytes(b, r.Key)
	b = binary.AppendUvarint(b, uint64(len(r.Headers)))
	for _, h := range r.Headers {
		b = appendBytes(b, []byte(h.Key))
		b = appendBytes(b, h.Value)
	}
	return append(b, r.Value...)
}

// Size is len(Append(nil, r)), without encoding.
func Size(r Record) int {
	n := 2 + sized(len(r.Topic)) + sized(len(r.Key)) + uvarintLen(uint64(len(r.Headers))) + len(r.Value)
	for _, h := range r.Headers {
		n += sized(len(h.Key)) + sized(len(h.Value))
	}
	return n
}

func sized(n int) int { return uvarintLen(uint64(n)) + n }

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed outbox record")

// Decode parses a record encoded by Append. The record's byte slices alias
// b.
func Decode(b []byte) (Record, error) {
	if len(b) < 2 || b[0] != magic {
		return Record{}, fmt.Errorf("%w: no record header", ErrMalformed)
	}
	if b[1] != version {
		return Record{}, fmt.Errorf("%w: version %d, this relay reads version %d: upgrade the relay", ErrMalformed, b[1], version)
	}
	d := decoder{b: b[2:]}
	var r Record
	r.Topic = string(d.bytes("topic"))
	r.Key = d.bytes("key")
	n := d.uvarint("header count")
	if d.err == nil && n > uint64(len(d.b)) { // each header takes at least 2 bytes
		d.fail("header count")
	}
	if d.err == nil && n > 0 {
		r.Headers = make([]kafka.Header, 0, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			k := d.bytes("header key")
			v := d.bytes("header value")
			r.Headers = append(r.Headers, kafka.Header{Key: string(k), Value: v})
		}
	}
	if d.err != nil {
		return Record{}, d.err
	}
	r.Value = d.b
	return r, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s", ErrMalformed, what)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(what string) []byte {
	n := d.uvarint(what)
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(what)
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}
