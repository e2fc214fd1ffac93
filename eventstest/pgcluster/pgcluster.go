// Package pgcluster starts throwaway PostgreSQL clusters, for tests (yours
// and ours) and the demo, with the machine's own initdb and pg_ctl: they run
// on a machine that has the Postgres binaries but no server, and never touch
// a real database.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a running throwaway PostgreSQL server. Stop it when done: it
// removes the data directory.
type Cluster struct {
	// URL connects to the cluster's "postgres" database as the superuser.
	URL string

	dir  string
	bin  string
	opts string // pg_ctl -o: port, socket directory and settings
	cred *syscall.Credential
}

// binDir finds the directory holding initdb: $PG_BIN, then PATH, then the
// usual Debian and Red Hat locations.
func binDir() (string, error) {
	if d := os.Getenv("PG_BIN"); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin/initdb", "/usr/pgsql-*/bin/initdb", "/usr/local/pgsql/bin/initdb"} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return filepath.Dir(m[len(m)-1]), nil
		}
	}
	return "", errors.New("pgcluster: initdb not found: install PostgreSQL (e.g. apt-get install postgresql) or set PG_BIN, or give a database URL")
}

// credential returns who runs the server: initdb refuses to run as root, so
// as root the cluster belongs to the "postgres" (or "nobody") user.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("pgcluster: running as root and no postgres or nobody user to run the server as")
}

// freePort asks the kernel for a free TCP port on the loopback interface.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Option configures a cluster Start makes.
type Option func(*settings)

type settings struct{ extra []string }

// WithSetting starts the server with one more configuration parameter,
// e.g. WithSetting("wal_level", "logical") for tests of logical
// replication. The name and value are passed to postgres as -c name=value.
func WithSetting(name, value string) Option {
	return func(s *settings) { s.extra = append(s.extra, name+"="+value) }
}

// Start initialises a cluster in a new temporary directory and starts it on
// a free loopback port. Durability is traded for speed (fsync off): the
// cluster is for tests and demos only.
func Start(ctx context.Context, opts ...Option) (*Cluster, error) {
	var set settings
	for _, o := range opts {
		o(&set)
	}
	for _, kv := range set.extra {
		if strings.ContainsAny(kv, " \t\n'\"\\") {
			return nil, fmt.Errorf("pgcluster: setting %q: names and values without spaces or quotes only", kv)
		}
	}
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "protoevents-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{dir: dir, bin: bin, cred: cred}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			c.cleanup()
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	data := filepath.Join(dir, "data")
	if err := c.run(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C"); err != nil {
		c.cleanup()
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			c.cleanup()
			return nil, fmt.Errorf("pgcluster: free port: %w", err)
		}
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", port, dir)
		for _, kv := range set.extra {
			opts += " -c " + kv
		}
		c.opts = opts
		lastErr = c.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "-t", "60", "start")
		if lastErr == nil {
			c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
			if err := c.ping(ctx); err != nil {
				c.Stop()
				return nil, err
			}
			return c, nil
		}
	}
	log, _ := os.ReadFile(filepath.Join(dir, "log"))
	c.cleanup()
	return nil, fmt.Errorf("%w\nserver log:\n%s", lastErr, log)
}

func (c *Cluster) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return fmt.Errorf("pgcluster: connect to new cluster: %w", err)
	}
	return conn.Close(ctx)
}

// run runs one of the Postgres binaries as the cluster's owner.
func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgcluster: %s: %w: %s", name, err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// Stop shuts the server down immediately and deletes its files.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "immediate", "-w", "stop")
	c.cleanup()
	return err
}

// Down shuts the server down (fast mode: sessions are disconnected,
// transactions roll back) but keeps its files, for tests of a database
// outage; Up starts it again on the same port.
func (c *Cluster) Down(ctx context.Context) error {
	return c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "fast", "-w", "stop")
}

// Crash stops the server as a power cut would look to its clients
// (immediate mode: no checkpoint, crash recovery at the next Up) and keeps
// its files.
func (c *Cluster) Crash(ctx context.Context) error {
	return c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-m", "immediate", "-w", "stop")
}

// Up starts a cluster stopped with Down again, on the same port and URL.
func (c *Cluster) Up(ctx context.Context) error {
	if err := c.run(ctx, "pg_ctl", "-D", filepath.Join(c.dir, "data"), "-l", filepath.Join(c.dir, "log"), "-o", c.opts, "-w", "-t", "60", "start"); err != nil {
		return err
	}
	return c.ping(ctx)
}

func (c *Cluster) cleanup() { os.RemoveAll(c.dir) }
