package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/telemetry"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// With Pprof the metrics listener serves Go's profiles too; without, it
// serves /metrics only.
func TestPprof(t *testing.T) {
	for _, on := range []bool{true, false} {
		tel, err := telemetry.New(context.Background(), telemetry.Config{PrometheusAddr: "127.0.0.1:0", Pprof: on})
		if err != nil {
			t.Fatal(err)
		}
		base := "http://" + tel.MetricsAddr()
		code, body := get(t, base+"/debug/pprof/goroutine?debug=1")
		if on && (code != 200 || !strings.Contains(body, "goroutine profile:")) {
			t.Errorf("pprof on: goroutine profile: %d %.200s", code, body)
		}
		if !on && code != 404 {
			t.Errorf("pprof off: /debug/pprof/goroutine: %d, want 404", code)
		}
		if code, body := get(t, base+"/debug/pprof/"); on && (code != 200 || !strings.Contains(body, "heap")) {
			t.Errorf("pprof index: %d %.200s", code, body)
		}
		if code, _ := get(t, base+"/metrics"); code != 200 {
			t.Errorf("metrics: %d", code)
		}
		if err := tel.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPprofAndUIURLValidation(t *testing.T) {
	for _, c := range []struct {
		cfg  telemetry.Config
		want string
	}{
		{telemetry.Config{Pprof: true}, "metrics.pprof: profiles are served on the metrics listener: set metrics.listen too"},
		{telemetry.Config{UIURL: "localhost:16686"}, `tracing.ui_url: "localhost:16686": want an http:// or https:// URL`},
		{telemetry.Config{UIURL: "http://"}, `tracing.ui_url: "http://": want an http:// or https:// URL`},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	ok := telemetry.Config{UIURL: "http://127.0.0.1:16686"}
	if err := ok.Validate(); err != nil {
		t.Error(err)
	}
}
