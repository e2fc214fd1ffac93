// Package health serves the liveness and readiness handlers of the
// runtime's long-running processes (relay, consumer) in one shape: the
// status as plain text, 200 when the probe holds and 503 when it does not,
// never cached.
package health

import "net/http"

// Check reads a process's health at the time of a request: its text and
// whether it is live and ready. It must not block (no I/O per request).
type Check func() (text string, live, ready bool)

// Live serves check's text, 200 while it reports live.
func Live(check Check) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		text, live, _ := check()
		serve(w, text, live)
	})
}

// Ready serves check's text, 200 while it reports ready.
func Ready(check Check) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		text, _, ready := check()
		serve(w, text, ready)
	})
}

func serve(w http.ResponseWriter, body string, ok bool) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(body))
}
