package webapi_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/testwasm"
	"github.com/streamd/streamd/internal/webapi"
)

var (
	screenshot      = flag.String("screenshot", "", "write the console's screenshot of a running job to this PNG file (docs/console.png)")
	traceScreenshot = flag.String("trace-screenshot", "", "write the console's screenshot of a checkpoint's trace to this PNG file (docs/console-trace.png)")
)

// chromium finds Debian's chromium (make deps installs it).
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium binary on PATH (make deps installs Debian's chromium): the console's browser test does not run")
	return ""
}

// The console in a real browser, headless and on loopback only: the page of
// a running job shows its graph with each subtask's state, live rates, each
// subtask's watermark, back-pressure, busy and idle time, updating, and a
// completed checkpoint; its stop-with-savepoint button stops the job.
func TestConsoleInBrowser(t *testing.T) {
	bin := chromium(t)
	tc := newCluster(t, webapi.Options{TracingUIURL: "http://127.0.0.1:16686", Service: "streamd-test"})
	jobPath := foreverJob(t, "forever")
	id := tc.deploy(jobPath)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox, // tests run as root
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1100),
		// Loopback only: anything else goes to a proxy that is not there
		// (loopback addresses bypass proxies).
		chromedp.ProxyServer("http://127.0.0.1:9"),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(actx)
	defer cancelCtx()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()

	// Start the browser before anything listens to it.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	// Every error and uncaught exception of the page fails the test.
	var mu sync.Mutex
	var jsErrors []string
	go func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				mu.Lock()
				jsErrors = append(jsErrors, fmt.Sprintf("%s at %s:%d: %s", m.Type, m.URL, m.Line, m.Text))
				mu.Unlock()
			}
		}
	}()

	// The job list links to the job.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(tc.url+"/"),
		chromedp.WaitVisible(`#jobs tr[data-job="`+id+`"] a`),
		chromedp.Click(`#jobs tr[data-job="`+id+`"] a`),
		chromedp.WaitVisible(`#job-page[data-id="`+id+`"]`),
	); err != nil {
		t.Fatalf("job list: %v", err)
	}

	// The graph: three operators, upper with two running subtasks, the
	// edges with their partitioning; a completed checkpoint; rates.
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(`svg .node[data-id="gen"]`),
		chromedp.WaitVisible(`svg .node[data-id="out"]`),
		voidPoll(`document.querySelectorAll('svg .node[data-id="upper"] rect.subtask[data-state="running"]').length == 2`),
		chromedp.WaitVisible(`#checkpoints tbody tr[data-kind="checkpoint"]`),
		// Records per second, from two polls a second apart.
		voidPoll(`/^[0-9.]+ (k|M)?\/s$/.test(document.querySelector('#vertices tr[data-id="out"] .rate-in').textContent)`),
	); err != nil {
		t.Fatalf("job page: %v", err)
	}
	// Each subtask's watermark, back-pressure, busy and idle time per
	// second, updating live: upper[0]'s watermark advances on the page.
	subtask := `#subtasks tr[data-id="upper"][data-subtask="0"] `
	if err := chromedp.Do(ctx,
		voidPoll(`document.querySelectorAll('#subtasks tbody tr').length == 4`),
		voidPoll(`/^[0-9]+$/.test(document.querySelector('#subtasks tr[data-id="gen"] td.output-watermark').textContent) &&
			[...document.querySelectorAll('#subtasks tr[data-id="upper"], #subtasks tr[data-id="out"]')].every(tr =>
			/^[0-9]+$/.test(tr.querySelector('td.watermark').textContent) &&
			/^[0-9]+ ms\/s \([0-9]+%\)$/.test(tr.querySelector('td.backpressure').textContent) &&
			/^[0-9]+ ms\/s/.test(tr.querySelector('td.busy').textContent) &&
			/^[0-9]+ ms\/s/.test(tr.querySelector('td.idle').textContent))`),
	); err != nil {
		table, _ := chromedp.Run(ctx, chromedp.Text(`#subtask-table`))
		t.Fatalf("subtask table: %v; the page shows:\n%s", err, table)
	}
	wm0, err := chromedp.Run(ctx, chromedp.Evaluate[int64](`+document.querySelector('`+subtask+`td.watermark').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, voidPoll(fmt.Sprintf(`+document.querySelector('%std.watermark').textContent > %d`, subtask, wm0))); err != nil {
		t.Fatalf("upper[0]'s watermark stays at %d on the page: %v", wm0, err)
	}
	row, err := chromedp.Run(ctx, chromedp.Text(subtask))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("upper[0] on the page: %s", row)
	upperSubtasks, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('svg .node[data-id="upper"] rect.subtask').length`))
	if err != nil {
		t.Fatal(err)
	}
	edges, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('svg .edge[data-partitioning="rebalance"][data-from="gen"][data-to="upper"], svg .edge[data-partitioning="hash"][data-from="upper"][data-to="out"]').length`))
	if err != nil {
		t.Fatal(err)
	}
	if upperSubtasks != 2 || edges != 2 {
		t.Errorf("graph: upper has %d subtasks (want 2), %d of the 2 edges with their partitioning", upperSubtasks, edges)
	}
	// With tracing.ui_url, links to the job's and each checkpoint's traces in Jaeger.
	links, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[document.querySelector('#job-trace').href,
		document.querySelector('#checkpoints tbody tr[data-kind="checkpoint"] a.jaeger').href]`))
	if err != nil {
		t.Fatal(err)
	}
	jobTags := `tags=` + url.QueryEscape(`{"streamd.job":"`+id+`"}`)
	cpTags := url.QueryEscape(`{"streamd.job":"forever","streamd.checkpoint_id":"`)
	if len(links) != 2 || !strings.HasPrefix(links[0], "http://127.0.0.1:16686/search?service=streamd-test&") ||
		!strings.HasSuffix(links[0], jobTags) || !strings.Contains(links[1], cpTags) {
		t.Errorf("trace links %q: want Jaeger searches by %s and %s...", links, jobTags, cpTags)
	}
	rate, err := chromedp.Run(ctx, chromedp.Text(`#vertices tr[data-id="out"] .rate-in`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sink's input rate on the page: %s", rate)
	if *screenshot != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The job's logs, its versions (none upgraded) and checkpoint counts.
	if err := chromedp.Do(ctx,
		voidPoll(`[...document.querySelectorAll('#logs tbody tr[data-source="task"] td.msg')].some(td => td.textContent.startsWith('attempt started'))`),
		chromedp.WaitVisible(`#no-versions`),
		voidPoll(`+document.querySelector('#checkpoint-counts [data-count="completed"] b').textContent > 0 &&
			document.querySelector('#checkpoint-counts [data-count="failed"] b').textContent === '0'`),
	); err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Text(`#main`))
		t.Fatalf("logs, versions, checkpoint counts: %v; the page shows:\n%s", err, page)
	}
	logLine, err := chromedp.Run(ctx, chromedp.Text(`#logs tbody tr`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first log line on the page: %s", logLine)
	// Only upper's lines (it logs none), then all again.
	choose := func(op string) chromedp.Action[chromedp.Void] {
		return voidPoll(`(s => (s.value = '` + op + `', s.dispatchEvent(new Event('change')), true))(document.querySelector('#log-operator'))`)
	}
	if err := chromedp.Do(ctx,
		choose("upper"),
		voidPoll(`document.querySelectorAll('#logs tbody tr').length == 0 && document.querySelector('#log-note').textContent.startsWith('No log lines')`),
		choose(""),
		voidPoll(`document.querySelectorAll('#logs tbody tr[data-source="task"]').length > 0`),
	); err != nil {
		t.Fatalf("log filter by operator: %v", err)
	}

	// The hosts page: h1 running the job, linked.
	if err := chromedp.Do(ctx,
		chromedp.Click(`#nav-hosts`),
		chromedp.WaitVisible(`#hosts tr[data-host="h1"] a[href="#/jobs/`+id+`"]`),
	); err != nil {
		t.Fatalf("hosts page: %v", err)
	}
	hostRow, err := chromedp.Run(ctx, chromedp.Text(`#hosts tr[data-host="h1"]`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(hostRow, "alive") {
		t.Errorf("hosts page: h1 shows %q, want alive", hostRow)
	}

	// A checkpoint's trace as a waterfall, from the console's own recorder
	// (no Jaeger): the checkpoint, each subtask's part, its persist, and
	// the subtasks' snapshots; each subtask's part in a table.
	if err := chromedp.Do(ctx,
		chromedp.Click(`#hosts tr[data-host="h1"] a`),
		chromedp.WaitVisible(`#checkpoints tbody tr[data-kind="checkpoint"] a.waterfall`),
		chromedp.Click(`#checkpoints tbody tr[data-kind="checkpoint"] a.waterfall`),
		chromedp.WaitVisible(`#trace-page #waterfall`),
		voidPoll(`document.querySelectorAll('#waterfall .span-row[data-name="checkpoint"]').length == 1 &&
			document.querySelectorAll('#waterfall .span-row[data-name="checkpoint.subtask"]').length == 4 &&
			document.querySelectorAll('#waterfall .span-row[data-name="checkpoint.persist"]').length == 1 &&
			document.querySelectorAll('#waterfall .span-row[data-name="task.snapshot"]').length > 0 &&
			document.querySelectorAll('#trace-subtasks tbody tr').length == 4 &&
			[...document.querySelectorAll('#trace-subtasks td.ack')].every(td => /^[0-9.]+ (ms|s)$/.test(td.textContent)) &&
			document.querySelector('#trace-outcome').textContent === 'completed'`),
	); err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Text(`#main`))
		t.Fatalf("checkpoint trace: %v; the page shows:\n%s", err, page)
	}
	title, err := chromedp.Run(ctx, chromedp.Text(`#trace-page h1`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("trace page: %s", title)
	if *traceScreenshot != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*traceScreenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Do(ctx,
		chromedp.Click(`#trace-page h1 a[href="#/jobs/`+id+`"]`),
		chromedp.WaitVisible(`#job-page[data-id="`+id+`"] #btn-stop`),
	); err != nil {
		t.Fatalf("back to the job: %v", err)
	}

	// An upgrade shows on the page as the job's second version.
	uctx, ucancel := context.WithTimeout(ctx, time.Minute)
	defer ucancel()
	if _, err := tc.client.Upgrade(uctx, id, nil, "", filepath.Join(filepath.Dir(jobPath), "uppercase.wasm"), "upper", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(`#versions tr[data-version="2"] [data-state="running"]`),
		chromedp.WaitVisible(`#versions tr[data-version="1"] [data-state="replaced"]`),
	); err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Text(`#version-section`))
		t.Fatalf("versions after an upgrade: %v; the page shows:\n%s", err, page)
	}

	// Stop with a savepoint from the page.
	if err := chromedp.Do(ctx,
		chromedp.Click(`#btn-stop`, chromedp.NodeEnabled),
		chromedp.WaitVisible(`#job-state [data-state="stopped"]`),
		chromedp.WaitVisible(`#message.ok`),
		chromedp.WaitVisible(`#checkpoints tbody tr[data-kind="savepoint"]`),
		voidPoll(`document.querySelector('#btn-stop').disabled && document.querySelector('#btn-cancel').disabled`),
	); err != nil {
		t.Fatalf("stop from the page: %v", err)
	}
	msg, err := chromedp.Run(ctx, chromedp.Text(`#message`))
	if err != nil {
		t.Fatal(err)
	}
	var job webapi.JobDetail
	call(t, http.MethodGet, tc.url+"/jobs/"+id, "", &job)
	if job.State != wire.JobStopped || job.Savepoint == "" || !strings.Contains(msg, job.Savepoint) {
		t.Errorf("after the click: job %s, savepoint %q; the page says %q", job.State, job.Savepoint, msg)
	}
	if _, err := os.Stat(job.Savepoint + "/_metadata"); err != nil {
		t.Errorf("savepoint: %v", err)
	}

	// A job that fails: its failures in words, the raw message folded
	// beneath (the guest's panic).
	failing := tc.deploy(testwasm.FailingJob(t, t.TempDir()))
	if err := chromedp.Do(ctx,
		chromedp.Navigate(tc.url+"/#/jobs/"+failing),
		chromedp.WaitVisible(`#job-state [data-state="failed"]`),
		voidPoll(`[...document.querySelectorAll('#exceptions p.summary')].some(p => p.textContent.startsWith('The module of operator boom (subtask 0) failed in process during attempt 0: '))`),
		voidPoll(`[...document.querySelectorAll('#exceptions details pre.exception')].some(p => p.textContent.includes('conformance panic'))`),
	); err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Text(`#exception-section`))
		t.Fatalf("failures in words: %v; the page shows:\n%s", err, page)
	}
	summary, err := chromedp.Run(ctx, chromedp.Text(`#exceptions p.summary`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failure on the page: %s", summary)

	mu.Lock()
	defer mu.Unlock()
	if len(jsErrors) > 0 {
		t.Errorf("errors in the page: %s", strings.Join(jsErrors, "\n"))
	}
}

// voidPoll waits until the expression is true in the page.
func voidPoll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr)
}
