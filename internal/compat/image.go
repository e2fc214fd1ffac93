package compat

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Field numbers of buf's image format (buf.alpha.image.v1): an Image is a
// FileDescriptorSet whose files carry an ImageFileExtension in field 8042,
// whose field 1 (is_import) marks files that were only imports.
const (
	bufExtensionField = 8042
	bufIsImportField  = 1
)

// FilesFromImage decodes a buf image or a protoc FileDescriptorSet
// (`buf build -o x.binpb`, `protoc --include_imports -o x.binpb`) and returns
// the files to take events from: every file of a FileDescriptorSet, or the
// non-import files of a buf image. Imports must be included: the referenced
// types are resolved through them.
func FilesFromImage(data []byte) ([]protoreflect.FileDescriptor, error) {
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("compat: decode image: %w", err)
	}
	if len(set.GetFile()) == 0 {
		return nil, fmt.Errorf("compat: decode image: no files (is it a buf image or FileDescriptorSet?)")
	}
	reg, err := protodesc.NewFiles(&set)
	if err != nil {
		return nil, fmt.Errorf("compat: decode image (built with imports included?): %w", err)
	}
	var out []protoreflect.FileDescriptor
	for _, fdp := range set.GetFile() {
		if isImport(fdp) {
			continue
		}
		fd, err := reg.FindFileByPath(fdp.GetName())
		if err != nil {
			return nil, fmt.Errorf("compat: decode image: %w", err)
		}
		out = append(out, fd)
	}
	return out, nil
}

// isImport reads buf's is_import mark from a file's unknown fields.
func isImport(fdp *descriptorpb.FileDescriptorProto) bool {
	b := fdp.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == bufExtensionField && typ == protowire.BytesType {
			ext, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return false
			}
			if importFlag(ext) {
				return true
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return false
		}
		b = b[m:]
	}
	return false
}

// importFlag reads is_import from an encoded ImageFileExtension.
func importFlag(b []byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == bufIsImportField && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			return m > 0 && v != 0
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return false
		}
		b = b[m:]
	}
	return false
}
