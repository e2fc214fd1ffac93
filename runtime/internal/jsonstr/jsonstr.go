// Package jsonstr appends Go strings as JSON strings: the one escaper of
// the runtime, for the envelope (escaped as encoding/json does), the
// payload (as protojson does) and the outbox's stored headers.
package jsonstr

import "unicode/utf8"

// Mode says which characters beyond the required ones are escaped, and
// what becomes of invalid UTF-8.
type Mode struct {
	// HTML escapes <, > and & as \u003c, \u003e and \u0026, and U+2028 and
	// U+2029 as \u2028 and \u2029, as encoding/json does by default.
	HTML bool
	// Replace writes each byte of invalid UTF-8 as \ufffd, as
	// encoding/json does; otherwise Append stops there and reports it.
	Replace bool
}

const hexDigits = "0123456789abcdef"

// plain and html mark the ASCII bytes written as they are.
var plain, html = func() (p, h [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		p[c] = c != '"' && c != '\\'
		h[c] = p[c] && c != '<' && c != '>' && c != '&'
	}
	return p, h
}()

// Append appends s to b as a JSON string, quotes included: '"', '\\' and
// control characters are always escaped (\b \f \n \r \t by name, the others
// as \u00XX), and the rest as m says. valid is false when s holds invalid
// UTF-8 and m does not replace it; b then ends inside the string.
func Append(b []byte, s string, m Mode) (out []byte, valid bool) {
	safe := &plain
	if m.HTML {
		safe = &html
	}
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			b = appendEscape(b, c)
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			if !m.Replace {
				return append(b, s[start:i]...), false
			}
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case m.HTML && (r == '\u2028' || r == '\u2029'):
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"'), true
}

// appendEscape appends the escape of the ASCII byte c.
func appendEscape(b []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(b, '\\', c)
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	return append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
}
