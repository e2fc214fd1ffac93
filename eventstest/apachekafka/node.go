package apachekafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
)

// Node is one broker (with its controller) of a Cluster: a JVM process this
// package started and owns.
type Node struct {
	id             int
	port           int
	controllerPort int
	dir            string
	clusterID      string
	classpath      string
	heap           string

	mu   sync.Mutex
	proc *exec.Cmd
	done chan struct{} // closed when proc has exited
}

// ID is the node's broker ID (node.id), from 1.
func (n *Node) ID() int { return n.id }

// Addr is the node's client address (127.0.0.1:port).
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// Running reports whether the node's process is alive.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

func (n *Node) java(args ...string) *exec.Cmd {
	level := os.Getenv(EnvLogLevel)
	if level == "" {
		level = "warn"
	}
	all := append([]string{
		"-Xmx" + n.heap, "-Xms64m", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=" + level, "-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
		"-Dorg.slf4j.simpleLogger.log.kafka.server.KafkaRaftServer=info",
		"-cp", n.classpath,
	}, args...)
	cmd := exec.Command("java", all...)
	cmd.Dir = n.dir
	// Its own process group, and (on Linux) SIGKILL when the owner dies: a
	// test that crashes leaves no broker behind.
	cmd.SysProcAttr = procAttr()
	return cmd
}

// format writes the node's storage metadata (once: a formatted directory
// is left as it is).
func (n *Node) format(ctx context.Context) error {
	cmd := n.java("kafka.tools.StorageTool", "format", "--ignore-formatted",
		"--cluster-id="+n.clusterID, "--config="+filepath.Join(n.dir, "server.properties"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("apachekafka: format node %d: %w", n.id, err)
	}
	wait := make(chan error, 1)
	go func() { wait <- cmd.Wait() }()
	select {
	case err := <-wait:
		if err != nil {
			return fmt.Errorf("apachekafka: format node %d: %w\n%s", n.id, err, tail(out.String(), 30))
		}
		return nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-wait
		return fmt.Errorf("apachekafka: format node %d: %w", n.id, ctx.Err())
	}
}

// launch starts the node's process, its output appended to broker.log.
func (n *Node) launch() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done != nil {
		select {
		case <-n.done:
		default:
			return fmt.Errorf("apachekafka: node %d is already running", n.id)
		}
	}
	logf, err := os.OpenFile(n.logPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("apachekafka: %w", err)
	}
	fmt.Fprintf(logf, "=== %s: starting node %d on %s\n", time.Now().Format(time.RFC3339Nano), n.id, n.Addr())
	cmd := n.java("kafka.Kafka", filepath.Join(n.dir, "server.properties"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("apachekafka: start node %d: %w", n.id, err)
	}
	done := make(chan struct{})
	n.proc, n.done = cmd, done
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	return nil
}

func (n *Node) logPath() string { return filepath.Join(n.dir, "broker.log") }

// Log returns the last lines of the node's log.
func (n *Node) Log(lines int) string {
	b, err := os.ReadFile(n.logPath())
	if err != nil {
		return err.Error()
	}
	return tail(string(b), lines)
}

// signal sends sig to the node's process group and waits up to grace for
// it to exit; it reports whether it did.
func (n *Node) signal(sig syscall.Signal, grace time.Duration) bool {
	n.mu.Lock()
	cmd, done := n.proc, n.done
	n.mu.Unlock()
	if cmd == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Kill ends the node at once with SIGKILL, as a crash or power cut would:
// no controlled shutdown, leadership moves only when the controller
// notices. Start brings it back.
func (n *Node) Kill() error {
	if !n.signal(syscall.SIGKILL, 30*time.Second) {
		return fmt.Errorf("apachekafka: node %d did not exit after SIGKILL", n.id)
	}
	return nil
}

// Pause freezes the node (SIGSTOP): its connections stay open but it
// answers nothing, as a node in a long GC pause or on a stalled disk
// would; as a follower it falls behind its leaders. Resume thaws it.
func (n *Node) Pause() error { return n.send(syscall.SIGSTOP) }

// Resume thaws a node frozen by Pause (SIGCONT).
func (n *Node) Resume() error { return n.send(syscall.SIGCONT) }

// send signals the node's process group without waiting.
func (n *Node) send(sig syscall.Signal) error {
	n.mu.Lock()
	cmd := n.proc
	n.mu.Unlock()
	if cmd == nil || !n.Running() {
		return fmt.Errorf("apachekafka: node %d is not running", n.id)
	}
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("apachekafka: node %d: %s: %w", n.id, sig, err)
	}
	return nil
}

// Stop shuts the node down cleanly (SIGTERM: the broker hands its
// partitions' leadership over first), or kills it after 20s or when ctx
// ends. Start brings it back.
func (n *Node) Stop(ctx context.Context) error {
	grace := 20 * time.Second
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < grace {
		grace = time.Until(dl)
	}
	if n.signal(syscall.SIGTERM, grace) {
		return nil
	}
	return n.Kill()
}

// Start starts a killed or stopped node again, on its ports and data, and
// waits until it answers.
func (n *Node) Start(ctx context.Context) error {
	if err := n.launch(); err != nil {
		return err
	}
	return n.waitReady(ctx, 1)
}

// waitReady waits until the node answers a metadata request listing at
// least brokers brokers.
func (n *Node) waitReady(ctx context.Context, brokers int) error {
	var last error
	for {
		n.mu.Lock()
		done := n.done
		n.mu.Unlock()
		select {
		case <-done:
			return fmt.Errorf("apachekafka: node %d exited while starting; its log:\n%s", n.id, n.Log(60))
		default:
		}
		last = n.ask(ctx, brokers)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apachekafka: node %d not ready (%v): %w; its log:\n%s", n.id, last, ctx.Err(), n.Log(60))
		case <-time.After(pollEvery):
		}
	}
}

func (n *Node) ask(ctx context.Context, brokers int) error {
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := (&kafka.Dialer{Timeout: 2 * time.Second}).DialContext(actx, "tcp", n.Addr())
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	got, err := conn.Brokers()
	if err != nil {
		return err
	}
	if len(got) < brokers {
		return errors.New("metadata lists " + strconv.Itoa(len(got)) + " of " + strconv.Itoa(brokers) + " brokers")
	}
	return nil
}
