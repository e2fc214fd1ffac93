package apachekafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

// EnvCache names the variable holding the directory brokers are fetched
// into; without it, the user's cache directory (~/.cache/protoevents/kafka).
const EnvCache = "PROTOEVENTS_KAFKA_CACHE"

// dependencyPlugin is the maven-dependency-plugin version Fetch runs,
// pinned so a clean Maven repository resolves the same plugin every time.
const dependencyPlugin = "3.8.1"

var versionPattern = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`)

// pom is the Maven project that fetches one broker version with its
// runtime dependencies. Kafka logs through SLF4J 1.x without shipping a
// binding in its Maven dependencies (the distribution's tarball adds one);
// slf4j-simple writes the broker's log to stderr, which Start keeps.
const pom = `<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>protoevents</groupId>
  <artifactId>apache-kafka-broker</artifactId>
  <version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>%s</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
`

// cacheDir returns where version is (or will be) fetched.
func cacheDir(version string) (string, error) {
	root := os.Getenv(EnvCache)
	if root == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("apachekafka: no cache directory (set %s): %w", EnvCache, err)
		}
		root = filepath.Join(base, "protoevents", "kafka")
	}
	return filepath.Join(root, version), nil
}

// Prerequisites reports, as an error naming the fix, whether this machine
// can fetch and run a broker: a JDK (java, 17 or later) and Maven (mvn).
func Prerequisites() error {
	var missing []string
	if _, err := exec.LookPath("java"); err != nil {
		missing = append(missing, "java (a JDK 17 or later)")
	}
	if _, err := exec.LookPath("mvn"); err != nil {
		missing = append(missing, "mvn (Apache Maven)")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("apachekafka: %s not found on PATH: the real-broker tier runs Apache Kafka from Maven Central; install them (Debian: apt-get install default-jdk-headless maven) or use the embedded broker", strings.Join(missing, " and "))
}

// Fetch makes sure the jars of Apache Kafka version are in the cache and
// returns their classpath. The first call downloads them with Maven (a few
// seconds with a warm Maven repository); later calls, from any process, find
// them in the cache. Concurrent callers wait on a file lock.
func Fetch(ctx context.Context, version string) (string, error) {
	if !versionPattern.MatchString(version) {
		return "", fmt.Errorf("apachekafka: version %q: want major.minor.patch, e.g. %s", version, DefaultVersion)
	}
	dir, err := cacheDir(version)
	if err != nil {
		return "", err
	}
	libs := filepath.Join(dir, "libs")
	classpath := filepath.Join(libs, "*")
	done := filepath.Join(dir, "complete")
	if _, err := os.Stat(done); err == nil {
		return classpath, nil
	}
	if err := Prerequisites(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("apachekafka: lock %s: %w", dir, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(done); err == nil {
		return classpath, nil // another process fetched it while we waited
	}
	if err := os.RemoveAll(libs); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	pomPath := filepath.Join(dir, "pom.xml")
	if err := os.WriteFile(pomPath, []byte(fmt.Sprintf(pom, version)), 0o644); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	cmd := exec.CommandContext(ctx, "mvn", "-q", "-B", "-f", pomPath,
		"org.apache.maven.plugins:maven-dependency-plugin:"+dependencyPlugin+":copy-dependencies",
		"-DincludeScope=runtime", "-DoutputDirectory="+libs)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("apachekafka: fetch Kafka %s: %w", version, ctx.Err())
		}
		return "", fmt.Errorf("apachekafka: fetch Kafka %s with Maven (org.apache.kafka:kafka_2.13:%s): %w\n%s", version, version, err, tail(out.String(), 40))
	}
	if _, err := os.Stat(filepath.Join(libs, "kafka_2.13-"+version+".jar")); err != nil {
		return "", errors.New("apachekafka: Maven finished but kafka_2.13-" + version + ".jar is not in " + libs)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	return classpath, nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
