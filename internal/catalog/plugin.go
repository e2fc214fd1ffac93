package catalog

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Generate is the plugin side: it builds the catalog of the request's files
// to generate and emits the AsyncAPI document as name (relative to the
// plugin's out directory, e.g. docs/events.asyncapi.yaml) and the Markdown
// catalog beside it (docs/events.md).
func Generate(p *protogen.Plugin, name string, info Info) error {
	clean := path.Clean(filepath.ToSlash(name))
	if name == "" || path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") ||
		!(strings.HasSuffix(clean, ".yaml") || strings.HasSuffix(clean, ".yml")) {
		return fmt.Errorf("catalog: %q: want a relative .yaml path inside the plugin's out directory, e.g. catalog=docs/events.asyncapi.yaml", name)
	}
	var files []protoreflect.FileDescriptor
	for _, f := range p.Files {
		if f.Generate {
			files = append(files, f.Desc)
		}
	}
	c, err := Build(files)
	if err != nil {
		return err
	}
	doc, err := AsyncAPI(c, info)
	if err != nil {
		return err
	}
	prefix := ""
	if m := moduleParam(p); m != "" {
		prefix = m + "/" // protogen strips it, as for Go files
	}
	if _, err := p.NewGeneratedFile(prefix+clean, "").Write(doc); err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	if _, err := p.NewGeneratedFile(prefix+MarkdownName(clean), "").Write(Markdown(c, info)); err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	return nil
}

// MarkdownName is where the Markdown catalog goes beside the AsyncAPI
// document: events.asyncapi.yaml gives events.md.
func MarkdownName(asyncapiName string) string {
	base := strings.TrimSuffix(strings.TrimSuffix(asyncapiName, ".yaml"), ".yml")
	return strings.TrimSuffix(base, ".asyncapi") + ".md"
}

// moduleParam returns the request's module= parameter.
func moduleParam(p *protogen.Plugin) string {
	var module string
	for _, param := range strings.Split(p.Request.GetParameter(), ",") {
		if k, v, ok := strings.Cut(param, "="); ok && k == "module" {
			module = v
		}
	}
	return module
}
