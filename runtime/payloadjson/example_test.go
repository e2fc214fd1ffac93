package payloadjson_test

import (
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/runtime/payloadjson"
)

// Append writes a payload the way the envelope does: a message
// protoc-gen-events generated an encoder for uses it, any other message
// (here a well-known type) goes through protojson, and the bytes are
// protojson's, compacted, either way.
func ExampleAppend() {
	m, _ := structpb.NewStruct(map[string]any{"order_id": "o-1", "items": []any{"sku-1", 2}})
	b, err := payloadjson.Append(nil, m)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(b))
	// Output: {"items":["sku-1",2],"order_id":"o-1"}
}
