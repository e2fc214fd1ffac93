package main

import (
	"fmt"
	"log/slog"
	"strings"
)

// logFlags registers --log-json and --log-level on a long-running command
// and returns the function that builds its logger once the flags are
// parsed. Logs go to stderr: text for people, JSON for log collectors.
func logFlags(fs *cmdFlags, env *cliEnv) func() (*slog.Logger, error) {
	asJSON := fs.Bool("log-json", false, "log as JSON instead of text")
	level := fs.String("log-level", "info", "least severe level logged: debug, info, warn or error")
	return func() (*slog.Logger, error) {
		var l slog.Level
		if err := l.UnmarshalText([]byte(strings.TrimSpace(*level))); err != nil {
			return nil, fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", errUsage, *level)
		}
		opts := &slog.HandlerOptions{Level: l}
		if *asJSON {
			return slog.New(slog.NewJSONHandler(env.stderr, opts)), nil
		}
		return slog.New(slog.NewTextHandler(env.stderr, opts)), nil
	}
}
