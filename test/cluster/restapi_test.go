package cluster_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/webapi"
)

// streamd server --http serves the controller's REST API and console: a
// deployed job is there, with its graph and final state.
func TestBinaryServerRESTAPI(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	env := []string{"STREAMD_NATS_URL=" + startServer(t, nil, "--http", addr)}
	base := "http://" + addr
	get := func(path string, out any) int {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("GET %s: %v in %s", path, err, b)
			}
		}
		return resp.StatusCode
	}
	id, errOut, code := streamd(t, env, "deploy", uppercaseJob(t))
	id = strings.TrimSpace(id)
	if code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, errOut)
	}
	var job webapi.JobDetail
	deadline := time.Now().Add(30 * time.Second)
	for get("/jobs/"+id, &job); job.State != wire.JobFinished; get("/jobs/"+id, &job) {
		if time.Now().After(deadline) {
			t.Fatalf("job %s not finished in 30s: %+v", id, job)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(job.Vertices) != 3 || job.Vertices[1].ID != "upper" || job.Vertices[1].RecordsIn != 4 || job.Vertices[1].Subtasks[0].State != wire.SubtaskFinished {
		t.Errorf("job %+v", job)
	}
	var plan webapi.PlanReply
	if get("/jobs/"+id+"/plan", &plan); len(plan.Plan.Edges) != 2 {
		t.Errorf("plan %+v", plan)
	}
	var jobs webapi.JobsReply
	if get("/jobs", &jobs); len(jobs.Jobs) != 1 || jobs.Jobs[0].ID != id {
		t.Errorf("jobs %+v", jobs)
	}
	if code := get("/", nil); code != 200 {
		t.Errorf("GET /: %d, want the console", code)
	}
}
