package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	ordersv2 "github.com/protoevents/protoevents/examples/gen/shop/orders/v2"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// examples compiles the example services' schemas, as buf generate hands
// them to the plugin.
func examples(t *testing.T) []protoreflect.FileDescriptor {
	t.Helper()
	root := "../../examples/proto"
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".proto") {
			rel, _ := filepath.Rel(root, p)
			paths = append(paths, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	comp := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{root, "../../schemas"}}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	linked, err := comp.Compile(context.Background(), paths...)
	if err != nil {
		t.Fatal(err)
	}
	var files []protoreflect.FileDescriptor
	for _, f := range linked {
		files = append(files, f)
	}
	return files
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/catalog -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (review, then go test ./internal/catalog -update):\n%s", name, got)
	}
}

// TestGolden renders the examples' catalog, compares it with the committed
// golden files, and renders it again from the files in reverse order to
// show the output does not depend on input order.
func TestGolden(t *testing.T) {
	files := examples(t)
	c, err := Build(files)
	if err != nil {
		t.Fatal(err)
	}
	info := Info{Title: "Shop events", Version: "2.0.0"}
	doc, err := AsyncAPI(c, info)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "shop.asyncapi.yaml", doc)
	golden(t, "shop.md", Markdown(c, info))

	rev := append([]protoreflect.FileDescriptor(nil), files...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	c2, err := Build(rev)
	if err != nil {
		t.Fatal(err)
	}
	doc2, _ := AsyncAPI(c2, info)
	if !bytes.Equal(doc, doc2) || !bytes.Equal(Markdown(c, info), Markdown(c2, info)) {
		t.Error("the catalog depends on the order of the input files")
	}
	var names []string
	for _, ev := range c.Events {
		names = append(names, ev.Name)
		if ev.Name == "shop.orders.v2.OrderPlaced" && (ev.Supersedes != "shop.orders.v1.OrderPlaced" || ev.Producer != "orders" || ev.KeyType != "string") {
			t.Errorf("v2 OrderPlaced: %+v", ev)
		}
		if ev.Name == "shop.orders.v1.OrderPlaced" && (len(ev.SupersededBy) != 1 || ev.SupersededBy[0] != "shop.orders.v2.OrderPlaced") {
			t.Errorf("v1 OrderPlaced superseded by %v", ev.SupersededBy)
		}
	}
	if len(names) != 18 {
		t.Errorf("events %v, want the examples' 18 (orders, shipping and the order saga)", names)
	}
}

// TestValidAsyncAPI validates the document with the AsyncAPI 3.0.0 JSON
// Schema published by the AsyncAPI Initiative (testdata, from
// @asyncapi/specs), and checks that a real protojson payload validates
// against the schema the document gives its message.
func TestValidAsyncAPI(t *testing.T) {
	c, err := Build(examples(t))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := AsyncAPI(c, Info{})
	if err != nil {
		t.Fatal(err)
	}
	doc := yamlToJSON(t, raw)

	comp := jsonschema.NewCompiler()
	specFile, err := os.Open("testdata/asyncapi-3.0.0.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := jsonschema.UnmarshalJSON(specFile)
	specFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := comp.AddResource("http://asyncapi.com/definitions/3.0.0/asyncapi.json", spec); err != nil {
		t.Fatal(err)
	}
	sch, err := comp.Compile("http://asyncapi.com/definitions/3.0.0/asyncapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(doc); err != nil {
		t.Fatalf("the AsyncAPI 3.0.0 schema rejects the document: %v", err)
	}

	// A broken document must fail, or the validation proves nothing.
	broken := yamlToJSON(t, bytes.Replace(raw, []byte("action: send"), []byte("action: shout"), 1))
	if err := sch.Validate(broken); err == nil {
		t.Fatal("the AsyncAPI schema accepts an operation with action: shout")
	}

	// The payload schema of OrderPlaced v2 accepts what protojson writes
	// (as the JSON envelope does: proto names) and refuses a wrong type.
	pc := jsonschema.NewCompiler()
	if err := pc.AddResource("mem://doc.json", doc); err != nil {
		t.Fatal(err)
	}
	ps, err := pc.Compile("mem://doc.json#/components/schemas/shop.orders.v2.OrderPlaced")
	if err != nil {
		t.Fatal(err)
	}
	ev := &ordersv2.OrderPlaced{OrderId: "o-1", Customer: &ordersv2.Customer{Id: "c-1"}, Total: &ordersv2.Money{Units: 4200, Currency: "EUR"},
		Items: []*ordersv2.LineItem{{Sku: "s", Quantity: 2}}}
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Validate(inst); err != nil {
		t.Errorf("payload %s does not match its schema: %v", b, err)
	}
	bad, _ := jsonschema.UnmarshalJSON(strings.NewReader(`{"order_id": 7}`))
	if err := ps.Validate(bad); err == nil {
		t.Error("the payload schema accepts a number for order_id")
	}
}

// yamlToJSON decodes YAML into the JSON value model jsonschema validates.
func yamlToJSON(t *testing.T, y []byte) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(y, &v); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return out
}
