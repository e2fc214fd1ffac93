// Package sqltmpl renders the runtime's SQL schema files: text/template
// files that each owning package (outbox, consumer, saga) embeds next to
// the code that migrates, filled with table names already validated and
// quoted (runtime/internal/sqlident, pgx.Identifier.Sanitize).
package sqltmpl

import (
	"bytes"
	"fmt"
	"io/fs"
	"text/template"
)

// Set is the templates parsed from one package's SQL files.
type Set struct{ t *template.Template }

// Must parses the files of fsys matching patterns (and the templates they
// define) and panics on a parse error: the files are embedded, so an error
// is a bug found by the package's first test.
func Must(fsys fs.FS, patterns ...string) *Set {
	return &Set{t: template.Must(template.New("").Option("missingkey=error").ParseFS(fsys, patterns...))}
}

// Render executes the named template (a file name, e.g. "outbox.sql", or a
// name a file defines) with data, whose fields must already be quoted
// identifiers or literals.
func (s *Set) Render(name string, data any) (string, error) {
	var b bytes.Buffer
	if err := s.t.ExecuteTemplate(&b, name, data); err != nil {
		return "", fmt.Errorf("render %s: %w", name, err)
	}
	return b.String(), nil
}
