package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestLogFlags: --log-level filters, --log-json switches to JSON lines, and
// an unknown level is a usage error.
func TestLogFlags(t *testing.T) {
	var stderr bytes.Buffer
	env := &cliEnv{stdout: &bytes.Buffer{}, stderr: &stderr, getenv: func(string) string { return "" }}
	fs := newFlags(env, "relay", "", "")
	newLogger := logFlags(fs, env)
	if err := parse(fs, []string{"--log-json", "--log-level", "warn"}); err != nil {
		t.Fatal(err)
	}
	log, err := newLogger()
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "lanes", 3)
	var rec map[string]any
	if err := json.Unmarshal(stderr.Bytes(), &rec); err != nil || rec["msg"] != "shown" || rec["level"] != "WARN" {
		t.Fatalf("log output %q (%v): want one JSON WARN line", stderr.String(), err)
	}

	fs = newFlags(env, "relay", "", "")
	newLogger = logFlags(fs, env)
	if err := parse(fs, []string{"--log-level", "loud"}); err != nil {
		t.Fatal(err)
	}
	if _, err := newLogger(); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "loud") {
		t.Fatalf("--log-level loud: %v, want a usage error naming it", err)
	}
}
