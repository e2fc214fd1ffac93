// Command protoc-gen-events is the protoevents code generator (skeleton).
package main

import "google.golang.org/protobuf/compiler/protogen"

func main() {
	protogen.Options{}.Run(func(p *protogen.Plugin) error { return nil })
}
