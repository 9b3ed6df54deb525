//go:build long

// Package jaegertest runs a real Jaeger (bin/jaeger, built by `make
// bin/jaeger` from tools/jaeger) on loopback with in-memory storage for the
// long tests, and reads traces back through its query API.
package jaegertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testwasm"
)

// Jaeger is a running Jaeger process on free loopback ports.
type Jaeger struct {
	OTLPGRPC string // host:port of the OTLP gRPC receiver
	OTLPHTTP string // http://host:port of the OTLP HTTP receiver
	Query    string // http://host:port of the query API and UI
	Log      string // path of Jaeger's log
}

// Start builds bin/jaeger if needed (make, serialized like testwasm builds),
// runs it with tools/jaeger/jaeger-loopback.yaml on free ports and waits
// until its query API answers. The process is killed at the end of the test.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin, err := testwasm.Build("bin/jaeger")
	if err != nil {
		t.Fatalf("jaegertest: build bin/jaeger: %v", err)
	}
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(filepath.Join(root, "tools", "jaeger", "jaeger-loopback.yaml"))
	if err != nil {
		t.Fatalf("jaegertest: %v", err)
	}
	ports := map[string]string{}
	text := string(conf)
	for _, p := range []string{"4317", "4318", "16685", "16686"} {
		ports[p] = freePort(t)
		old := "127.0.0.1:" + p
		if !strings.Contains(text, old) {
			t.Fatalf("jaegertest: jaeger-loopback.yaml does not bind %s", old)
		}
		text = strings.ReplaceAll(text, old, "127.0.0.1:"+ports[p])
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfgPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "jaeger.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("jaegertest: start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	j := &Jaeger{
		OTLPGRPC: "127.0.0.1:" + ports["4317"],
		OTLPHTTP: "http://127.0.0.1:" + ports["4318"],
		Query:    "http://127.0.0.1:" + ports["16686"],
		Log:      logPath,
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(j.Query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return j
			}
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("jaegertest: jaeger exited: %v\n%s", err, tail(string(log), 3000))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			t.Fatalf("jaegertest: query API at %s not up after 60s\n%s", j.Query, tail(string(log), 3000))
		}
	}
}

func freePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Trace is one trace of the query API (/api/traces), with each span's service
// resolved from its process.
type Trace struct {
	TraceID string `json:"traceID"`
	Spans   []Span `json:"spans"`
	// Processes maps processID to the process (service name and tags).
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// Span is a span of the query API.
type Span struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"` // CHILD_OF, FOLLOWS_FROM
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	ProcessID string `json:"processID"`
	Tags      []struct {
		Key   string `json:"key"`
		Type  string `json:"type"`
		Value any    `json:"value"`
	} `json:"tags"`
	Logs []struct {
		Fields []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"fields"`
	} `json:"logs"`
}

// Service is the service name of span s in tr.
func (tr *Trace) Service(s Span) string { return tr.Processes[s.ProcessID].ServiceName }

// Parent is the span ID s is a CHILD_OF ("" for a root).
func (s Span) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Tag returns the value of the tag key and whether s has it.
func (s Span) Tag(key string) (any, bool) {
	for _, t := range s.Tags {
		if t.Key == key {
			return t.Value, true
		}
	}
	return nil, false
}

// Traces queries /api/traces?service=service (the last hour, up to 100 traces).
func (j *Jaeger) Traces(ctx context.Context, service string) ([]Trace, error) {
	q := url.Values{"service": {service}, "limit": {"100"}, "lookback": {"1h"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.Query+"/api/traces?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jaegertest: query traces of %s: %w", service, err)
	}
	defer resp.Body.Close()
	var body struct {
		Data   []Trace `json:"data"`
		Errors []struct {
			Msg string `json:"msg"`
		} `json:"errors"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("jaegertest: decode traces of %s (HTTP %d): %w", service, resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaegertest: traces of %s: HTTP %d %v", service, resp.StatusCode, body.Errors)
	}
	return body.Data, nil
}

// WaitTrace polls the traces of service until one satisfies ok, or fails the
// test after timeout (export is asynchronous: flush the providers first).
func (j *Jaeger) WaitTrace(t testing.TB, service string, timeout time.Duration, ok func(*Trace) bool) *Trace {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last []Trace
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		traces, err := j.Traces(ctx, service)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for i := range traces {
			if ok(&traces[i]) {
				return &traces[i]
			}
		}
		last = traces
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(last, "", " ")
			t.Fatalf("jaegertest: no matching trace of %s after %v; got:\n%s", service, timeout, tail(string(b), 4000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
