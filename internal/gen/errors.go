package gen

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// SchemaError is one invalid event option, located in the .proto source so
// that editors and CI logs can jump to it. Its text has the form
//
//	orders/v1/orders.proto:12:1: orders.v1.OrderPlaced: key is required (fix: ...)
type SchemaError struct {
	// File is the .proto file path as the compiler knows it.
	File string
	// Line and Column are 1-based; both are 0 when the request carries no
	// source information.
	Line, Column int
	// Message is the full name of the message whose options are wrong.
	Message protoreflect.FullName
	// Problem says what is wrong; Fix says how to put it right.
	Problem, Fix string
}

// Error renders the error as "<file>:<line>:<col>: <message>: <problem> (fix: <fix>)".
func (e *SchemaError) Error() string {
	pos := e.File
	if e.Line > 0 {
		pos = fmt.Sprintf("%s:%d:%d", e.File, e.Line, e.Column)
	}
	return fmt.Sprintf("%s: %s: %s (fix: %s)", pos, e.Message, e.Problem, e.Fix)
}

// errorList collects SchemaErrors across a whole request.
type errorList []*SchemaError

// add records a problem with message m.
func (l *errorList) add(m *protogen.Message, problem, fix string) {
	file, line, col := position(m)
	*l = append(*l, &SchemaError{File: file, Line: line, Column: col, Message: m.Desc.FullName(), Problem: problem, Fix: fix})
}

// err returns the collected errors sorted by position and joined one per
// line, or nil when there are none.
func (l errorList) err() error {
	if len(l) == 0 {
		return nil
	}
	sorted := slices.Clone(l)
	slices.SortStableFunc(sorted, func(a, b *SchemaError) int {
		return cmp.Or(
			cmp.Compare(a.File, b.File),
			cmp.Compare(a.Line, b.Line),
			cmp.Compare(a.Column, b.Column),
			cmp.Compare(a.Error(), b.Error()),
		)
	})
	errs := make([]error, len(sorted))
	for i, e := range sorted {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// position returns the file path and the 1-based line and column where m is
// declared; line and column are 0 without source information.
func position(m *protogen.Message) (file string, line, col int) {
	fd := m.Desc.ParentFile()
	loc := fd.SourceLocations().ByDescriptor(m.Desc)
	if loc.Path == nil {
		return fd.Path(), 0, 0
	}
	return fd.Path(), loc.StartLine + 1, loc.StartColumn + 1
}

// where renders m's position as "file:line:col" for naming it in another
// message's error.
func where(m *protogen.Message) string {
	file, line, col := position(m)
	if line == 0 {
		return file
	}
	return fmt.Sprintf("%s:%d:%d", file, line, col)
}
