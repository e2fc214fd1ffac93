package payloadjson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/protoevents/protoevents/runtime/payloadjson"
)

// Each helper is held against protojson on the wrapper type of its kind,
// whose JSON form is the bare value: the bytes must be the same. The
// generated encoders are held against protojson message by message in
// internal/gen/generated.

func protojsonValue(t *testing.T, m proto.Message) string {
	t.Helper()
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func randomString(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(16) {
		switch r.IntN(4) {
		case 0:
			b.WriteByte(byte(r.IntN(0x80))) // ASCII, control characters included
		case 1:
			b.WriteRune(rune(r.IntN(0x2100)))
		default:
			b.WriteString([]string{`"`, `\`, "<", "\u2028", "😀", "é", "\x7f", "\u00a0"}[r.IntN(8)])
		}
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}

func TestAppendStringMatchesProtojson(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		s := randomString(r)
		if i < 0x80 {
			s = string(rune(i)) // every ASCII character alone
		}
		got, err := payloadjson.AppendString(nil, s, "f")
		if err != nil {
			t.Fatalf("AppendString(%q): %v", s, err)
		}
		if want := protojsonValue(t, wrapperspb.String(s)); string(got) != want {
			t.Fatalf("AppendString(%q) = %s, protojson %s", s, got, want)
		}
	}
}

func TestAppendStringRefusesInvalidUTF8(t *testing.T) {
	for _, s := range []string{"\xff", "ok\xc3", "\xed\xa0\x80", "a\x80b"} {
		_, err := payloadjson.AppendString([]byte("x"), s, "shop.v1.Order.note")
		var bad *payloadjson.InvalidUTF8Error
		if !errors.As(err, &bad) || bad.Field != "shop.v1.Order.note" {
			t.Errorf("AppendString(%q): %v, want an InvalidUTF8Error for shop.v1.Order.note", s, err)
		}
	}
}

func TestAppendNumbersMatchProtojson(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	edges := []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1), 1e-6, 1e-7, 1e20, 1e21,
		5e-324, math.MaxFloat64, math.SmallestNonzeroFloat32, math.MaxFloat32, 0.1, 1e-10, 123e-9}
	for i := range 20000 {
		f := math.Float64frombits(r.Uint64())
		if i < len(edges) {
			f = edges[i]
		}
		if got, want := string(payloadjson.AppendFloat(nil, f, 64)), protojsonValue(t, wrapperspb.Double(f)); got != want {
			t.Fatalf("AppendFloat(%v, 64) = %s, protojson %s", f, got, want)
		}
		f32 := float32(f)
		if i%2 == 1 {
			f32 = math.Float32frombits(r.Uint32())
		}
		if got, want := string(payloadjson.AppendFloat(nil, float64(f32), 32)), protojsonValue(t, wrapperspb.Float(f32)); got != want {
			t.Fatalf("AppendFloat(%v, 32) = %s, protojson %s", f32, got, want)
		}
		n := int64(r.Uint64()) >> r.IntN(64)
		if got, want := string(payloadjson.AppendInt64(nil, n)), protojsonValue(t, wrapperspb.Int64(n)); got != want {
			t.Fatalf("AppendInt64(%d) = %s, protojson %s", n, got, want)
		}
		u := r.Uint64() >> r.IntN(64)
		if got, want := string(payloadjson.AppendUint64(nil, u)), protojsonValue(t, wrapperspb.UInt64(u)); got != want {
			t.Fatalf("AppendUint64(%d) = %s, protojson %s", u, got, want)
		}
		raw := make([]byte, r.IntN(20))
		for j := range raw {
			raw[j] = byte(r.Uint32())
		}
		if got, want := string(payloadjson.AppendBytes(nil, raw)), protojsonValue(t, wrapperspb.Bytes(raw)); got != want {
			t.Fatalf("AppendBytes(%x) = %s, protojson %s", raw, got, want)
		}
	}
	if got := string(payloadjson.AppendBool(payloadjson.AppendBool(nil, true), false)); got != "truefalse" {
		t.Errorf("AppendBool: %s", got)
	}
}

func TestAppendEnum(t *testing.T) {
	for _, tc := range []struct {
		v    protoreflect.Enum
		want string
	}{
		{descriptorpb.FieldDescriptorProto_TYPE_STRING, `"TYPE_STRING"`},
		{descriptorpb.FieldDescriptorProto_Type(99), `99`}, // a value of a newer schema
		{descriptorpb.FieldDescriptorProto_Type(-3), `-3`},
		{structpb.NullValue_NULL_VALUE, `null`},
		{structpb.NullValue(5), `null`},
	} {
		if got := string(payloadjson.AppendEnum(nil, tc.v)); got != tc.want {
			t.Errorf("AppendEnum(%v) = %s, want %s", tc.v, got, tc.want)
		}
	}
}

func TestCompactMatchesJSONCompact(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 2000 {
		s, err := structpb.NewStruct(map[string]any{"text": randomString(r), "nested": map[string]any{"a": randomString(r), "b": []any{float64(i), "x y", map[string]any{}}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, multiline := range []bool{false, true} {
			b, err := protojson.MarshalOptions{Multiline: multiline}.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			if err := json.Compact(&want, b); err != nil {
				t.Fatal(err)
			}
			if got := payloadjson.Compact(bytes.Clone(b)); !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("Compact(%s) = %s, json.Compact = %s", b, got, want.Bytes())
			}
		}
	}
}

// A message without a generated encoder goes through protojson; an error
// leaves the bytes appended to as they were.
func TestAppendMessage(t *testing.T) {
	s, _ := structpb.NewStruct(map[string]any{"b": 1, "a": []any{"x", true}})
	got, err := payloadjson.Append([]byte("["), s)
	if err != nil || string(got) != `[{"a":["x",true],"b":1}` {
		t.Errorf("Append(Struct) = %s, %v", got, err)
	}
	got, err = payloadjson.Append([]byte("["), &structpb.Value{})
	if err == nil || string(got) != "[" {
		t.Errorf("Append(Value without kind) = %q, %v; want the input back and an error", got, err)
	}
}
