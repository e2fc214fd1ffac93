package health

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestHandlers(t *testing.T) {
	for _, tc := range []struct {
		live, ready     bool
		liveOK, readyOK int
	}{{true, true, 200, 200}, {true, false, 200, 503}, {false, false, 503, 503}} {
		check := func() (string, bool, bool) { return "status text", tc.live, tc.ready }
		for _, c := range []struct {
			h    http.Handler
			want int
		}{{Live(check), tc.liveOK}, {Ready(check), tc.readyOK}} {
			h, want := c.h, c.want
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if rec.Code != want || rec.Body.String() != "status text" || rec.Header().Get("Cache-Control") != "no-store" ||
				rec.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
				t.Errorf("live %v ready %v: %d %q %v, want %d", tc.live, tc.ready, rec.Code, rec.Body.String(), rec.Header(), want)
			}
		}
	}
}
