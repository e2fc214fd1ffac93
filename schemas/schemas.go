// Package schemas embeds the Protobuf schemas protoevents users compile
// against, so tools (eventsctl init) can copy the source of truth into a
// user's buf module instead of asking them to find it in the module cache.
package schemas

import _ "embed"

// OptionsProto is events/v1/options.proto: the (events.v1.event) and
// (events.v1.file) options that annotate event messages.
//
//go:embed events/v1/options.proto
var OptionsProto []byte

// OptionsPath is where OptionsProto must sit in a buf module (its import
// path).
const OptionsPath = "events/v1/options.proto"
