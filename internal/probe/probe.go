// Package probe serves the health texts of the relay's and the consumers'
// liveness and readiness handlers in one shape: 200 or 503, plain text,
// never cached.
package probe

import "net/http"

// Serve writes body with 200 when ok, else 503.
func Serve(w http.ResponseWriter, body string, ok bool) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(body))
}
