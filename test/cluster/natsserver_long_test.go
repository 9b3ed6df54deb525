//go:build long

package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/checkpoint"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// natsServerBin is bin/nats-server (make bin/nats-server, a prerequisite of
// make test-long) or a nats-server on PATH (Debian's package).
func natsServerBin(t *testing.T) string {
	t.Helper()
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	if p := filepath.Join(root, "bin", "nats-server"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	t.Fatal("no nats-server binary: run `make bin/nats-server` (or install Debian's nats-server)")
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// startNATSServer runs a nats-server process with args until the test ends
// and returns its client URL once it accepts connections.
func startNATSServer(t *testing.T, name string, port int, args ...string) string {
	t.Helper()
	cmd := exec.Command(natsServerBin(t), append([]string{"-a", "127.0.0.1", "-p", fmt.Sprint(port)}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return fmt.Sprintf("nats://127.0.0.1:%d", port)
}

// waitJetStream waits until url accepts connections and its JetStream
// answers (in a cluster: a meta leader was elected).
func waitJetStream(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		nc, err := natsutil.Connect(natsutil.URLs(url))
		if err == nil {
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err = js.AccountInfo(ctx)
			cancel()
			nc.Close()
			if err == nil {
				return
			}
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("NATS server %s: JetStream not ready after 30s: %v", url, last)
}

// standaloneNATS starts one nats-server process with JetStream.
func standaloneNATS(t *testing.T) string {
	url := startNATSServer(t, "nats-server", freePort(t), "-js", "-sd", t.TempDir(), "-n", "standalone")
	waitJetStream(t, url)
	return url
}

// natsCluster starts a 3-node NATS cluster on loopback (every node routes to
// the two others) with JetStream, and creates streamd's object store
// buckets with 3 replicas, so artifacts and checkpoints survive any node.
func natsCluster(t *testing.T) []string {
	var ports, cports [3]int
	for i := range ports {
		ports[i], cports[i] = freePort(t), freePort(t)
	}
	var urls []string
	for i := range ports {
		var routes []string
		for j := range cports {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", cports[j]))
			}
		}
		name := fmt.Sprintf("n%d", i+1)
		urls = append(urls, startNATSServer(t, "nats-server "+name, ports[i], "-js", "-sd", t.TempDir(), "-n", name,
			"--cluster_name", "streamd", "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", cports[i]),
			"--routes", strings.Join(routes, ",")))
	}
	for _, u := range urls {
		waitJetStream(t, u)
	}
	nc := connect(t, urls[0])
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, bucket := range []string{wire.ArtifactBucket, checkpoint.DefaultBucket} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: bucket, Replicas: 3})
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("create object store %s with 3 replicas: %v", bucket, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return urls
}

// TestStandaloneNATSServer runs the multi-host scenarios against a separate
// nats-server process: a job spread over three host processes gives the
// output of streamd run, and a SIGKILLed host fails over exactly once.
func TestStandaloneNATSServer(t *testing.T) {
	t.Run("spread", func(t *testing.T) {
		url := standaloneNATS(t)
		threeHostsSameAsRun(t, startProcesses(t, url, url, []string{url, url, url}, 1))
	})
	for _, storage := range []string{"dir", "jetstream"} {
		t.Run("kill-host-"+storage, func(t *testing.T) {
			url := standaloneNATS(t)
			killHostFailsOverOn(t, startProcesses(t, url, url, []string{url, url, url}, 2), storage)
		})
	}
}

// TestNATSCluster runs the same scenarios on a 3-node NATS cluster: the
// controller and host h1 on node 1, h2 on node 2, h3 on node 3 (so the data
// channels and control messages cross the cluster's routes); each process
// knows only its own node's URL.
func TestNATSCluster(t *testing.T) {
	t.Run("spread", func(t *testing.T) {
		urls := natsCluster(t)
		threeHostsSameAsRun(t, startProcesses(t, urls[0], urls[0], urls, 1))
	})
	for _, storage := range []string{"dir", "jetstream"} {
		t.Run("kill-host-"+storage, func(t *testing.T) {
			urls := natsCluster(t)
			killHostFailsOverOn(t, startProcesses(t, urls[0], urls[0], urls, 2), storage)
		})
	}
}
