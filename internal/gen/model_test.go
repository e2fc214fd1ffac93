package gen

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/protoevents/protoevents/runtime/eventsv1"
)

// TestExtensionFromUnknownFields covers options decoded without the
// events.v1 extensions known, as when a request is parsed by a binary that
// does not link eventsv1: they arrive as unknown fields and must still be
// read.
func TestExtensionFromUnknownFields(t *testing.T) {
	want := &eventsv1.EventOptions{Topic: "shop.order-placed.v1", Key: "order.id", Version: 2}
	known := &descriptorpb.MessageOptions{}
	proto.SetExtension(known, eventsv1.E_Event, want)
	b, err := proto.Marshal(known)
	if err != nil {
		t.Fatal(err)
	}
	unknown := &descriptorpb.MessageOptions{}
	if err := (proto.UnmarshalOptions{Resolver: new(protoregistry.Types)}).Unmarshal(b, unknown); err != nil {
		t.Fatal(err)
	}
	if proto.HasExtension(unknown, eventsv1.E_Event) || len(unknown.ProtoReflect().GetUnknown()) == 0 {
		t.Fatal("test setup: the option should be an unknown field")
	}
	got, ok, err := extension[*eventsv1.EventOptions](unknown, eventsv1.E_Event)
	if err != nil || !ok {
		t.Fatalf("extension: ok=%v err=%v", ok, err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}

	if _, ok, err := extension[*eventsv1.EventOptions](&descriptorpb.MessageOptions{}, eventsv1.E_Event); ok || err != nil {
		t.Errorf("options without the extension: ok=%v err=%v, want false, nil", ok, err)
	}
}

func TestRegistryName(t *testing.T) {
	for in, want := range map[string]string{
		"orders/v1/orders.proto":  "OrdersEvents",
		"order_events.proto":      "OrderEventsEvents",
		"a/b/shop-items.v2.proto": "ShopItemsV2Events",
		"3d/3d_models.proto":      "File3dModelsEvents",
	} {
		if got := registryName(in); got != want {
			t.Errorf("registryName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckTopic(t *testing.T) {
	long := make([]byte, maxTopicLen)
	for i := range long {
		long[i] = 'x'
	}
	for topic, valid := range map[string]bool{
		"orders.order-placed.v1": true,
		"A_b-C.9":                true,
		string(long):             true,
		string(long) + "x":       false,
		"":                       false,
		".":                      false,
		"..":                     false,
		"...":                    true,
		"orders/placed":          false,
		"ordérs":                 false,
	} {
		if got := checkTopic(topic) == ""; got != valid {
			t.Errorf("checkTopic(%q) valid = %v, want %v (%s)", topic, got, valid, checkTopic(topic))
		}
	}
}

func TestKebab(t *testing.T) {
	for in, want := range map[string]string{
		"OrderPlaced":  "order-placed",
		"DLQIsTopic":   "dlq-is-topic",
		"Order_Placed": "order-placed",
		"V2Event":      "v2-event",
		"Dot":          "dot",
	} {
		if got := kebab(in); got != want {
			t.Errorf("kebab(%q) = %q, want %q", in, got, want)
		}
	}
}
