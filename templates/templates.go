// Package templates holds the SQL schema of protoevents (the outbox, the
// consumers' dedup table and DLQ bookkeeping) as embedded text/template
// files: one source of truth that the runtime's Migrate functions and the
// operator CLI render with validated, quoted table names.
package templates

import (
	"bytes"
	"embed"
	"fmt"
	"text/template"
)

//go:embed *.sql
var files embed.FS

var parsed = template.Must(template.New("").Option("missingkey=error").ParseFS(files, "*.sql"))

// Render executes the named SQL template (e.g. "outbox.sql") with data,
// whose fields must already be quoted identifiers (pgx.Identifier.Sanitize).
func Render(name string, data any) (string, error) {
	var b bytes.Buffer
	if err := parsed.ExecuteTemplate(&b, name, data); err != nil {
		return "", fmt.Errorf("templates: render %s: %w", name, err)
	}
	return b.String(), nil
}
