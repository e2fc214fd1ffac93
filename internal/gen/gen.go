// Package gen is the protoc-gen-events code generator: it reads the
// (events.v1.event) options of a protogen request, validates them, and
// renders for each .proto file with events a <file>.events.go holding the
// events' constants, descriptors, key methods, typed outbox producers,
// typed idempotent consumers and the file's registry.
//
// # Generated names
//
// For an event message with Go name M (protogen's GoIdent, so a nested
// Outer.Inner is Outer_Inner) the file declares MTopic, MDLQTopic,
// MEventType, MSchemaVersion, the descriptor MEvent, MProducer with
// NewMProducer, MHandler and HandleM (registering an MHandler on a
// *consumer.Consumer), and the methods EventKey and
// EventDescriptor on M. A clash with a name protoc-gen-go declares in the
// same package is a generation error naming both. The file's registry is
// <Base>Events, from the file's base name (orders.proto: OrdersEvents); if
// that name is taken, it falls back to <Base>ProtoEvents (OrdersProtoEvents).
//
// # Validation
//
// All event options of the request are checked before anything is written,
// and every problem is reported, sorted by position, one per line, as
// "<file>:<line>:<col>: <message>: <problem> (fix: <fix>)". Topics are
// checked for clashes across every file of the request, and supersedes may
// name an event in any of them, so run the plugin over all schemas at once
// (buf's strategy: all) or import the superseded event's file.
//
// It does no I/O: the generated files are handed to the protogen.Plugin,
// which answers the compiler.
package gen

import (
	"fmt"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protoevents/protoevents/runtime/events"
)

// Version is the version of the generator, printed in the header of every
// generated file; it moves with the runtime, which lives in the same module.
const Version = events.Version

// Features the generator supports, declared to the compiler so that proto3
// optional fields and editions files are not refused.
const (
	SupportedFeatures        = uint64(pluginpb.CodeGeneratorResponse_FEATURE_PROTO3_OPTIONAL | pluginpb.CodeGeneratorResponse_FEATURE_SUPPORTS_EDITIONS)
	SupportedEditionsMinimum = descriptorpb.Edition_EDITION_PROTO2
	SupportedEditionsMaximum = descriptorpb.Edition_EDITION_2023
)

// fileSuffix is appended to a .proto file's generated-name prefix.
const fileSuffix = ".events.go"

// Generate validates the event options of the whole request and, when all
// are valid, adds a <file>.events.go to p for each file to generate that
// declares events. Files without events get no output. On invalid options
// it adds nothing and returns every problem found, one per line, sorted by
// position.
func Generate(p *protogen.Plugin) error {
	p.SupportedFeatures = SupportedFeatures
	p.SupportedEditionsMinimum = SupportedEditionsMinimum
	p.SupportedEditionsMaximum = SupportedEditionsMaximum

	files, err := buildModel(p)
	if err != nil {
		return err
	}
	compiler := compilerVersion(p.Request.GetCompilerVersion())
	// Render everything before adding any file, so a failure adds nothing.
	out := make([][]byte, len(files))
	for i, mf := range files {
		if out[i], err = render(mf, compiler); err != nil {
			return err
		}
	}
	for i, mf := range files {
		g := p.NewGeneratedFile(mf.proto.GeneratedFilenamePrefix+fileSuffix, mf.proto.GoImportPath)
		if _, err := g.Write(out[i]); err != nil {
			return fmt.Errorf("%s: %w", mf.proto.Desc.Path(), err)
		}
	}
	return nil
}

// compilerVersion renders the compiler's version as protoc-gen-go does.
func compilerVersion(v *pluginpb.Version) string {
	if v == nil {
		return "(unknown)"
	}
	s := fmt.Sprintf("v%d.%d.%d", v.GetMajor(), v.GetMinor(), v.GetPatch())
	if suffix := v.GetSuffix(); suffix != "" {
		s += "-" + suffix
	}
	return s
}
