package wire

import (
	"errors"
	"fmt"
	"time"

	"github.com/streamd/streamd/control"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
)

// JobSpec is a job as it travels over NATS: the loaded, validated graph with
// every file the hosts need replaced by an Artifact in the object store. Paths
// of file sinks (and checkpoint directories) stay as the deploying client
// resolved them: they name directories on the host that runs the subtask.
type JobSpec struct {
	Name       string                      `json:"name"`
	Vertices   []VertexSpec                `json:"vertices"`
	Checkpoint *jobfile.CheckpointSettings `json:"checkpoint,omitempty"`
	Restart    jobfile.RestartSettings     `json:"restart"`
	JobFile    *Artifact                   `json:"job_file,omitempty"` // the job file as deployed; nil for a module
	// MaxRecordBytes is the job's max_record_bytes (jobfile.Job); 0 (a spec
	// from an older client): the host's runtime.max_record_bytes.
	MaxRecordBytes int `json:"max_record_bytes,omitempty"`
	// State is the job's state section (jobfile.Job.State, resolved by the
	// client); the zero value (a spec from an older client) is memory.
	State jobfile.StateSettings `json:"state,omitzero"`
	// Autoscaler is the job's autoscaler section (nil: none, off).
	Autoscaler *jobfile.AutoscalerSettings `json:"autoscaler,omitempty"`
}

// VertexSpec is one operator. Exactly one of Source, Sink and Wasm is set.
type VertexSpec struct {
	UID            string       `json:"uid"`
	Kind           control.Kind `json:"kind"`
	Parallelism    int          `json:"parallelism"`
	MaxParallelism int          `json:"max_parallelism"`
	// MinParallelism is the least parallelism the controller runs the
	// operator at when fewer slots are free than the job needs (adaptive.go);
	// 0 (none declared, or a spec of an older client): 1.
	MinParallelism int            `json:"min_parallelism,omitempty"`
	Inputs         []control.Edge `json:"inputs,omitempty"`

	Source     *jobfile.SourceSpec `json:"source,omitempty"`
	SourceFile *Artifact           `json:"source_file,omitempty"` // the file the source reads (connector.SourceArtifact); its local copy replaces it on the host
	Sink       *jobfile.SinkSpec   `json:"sink,omitempty"`
	Wasm       *WasmSpec           `json:"wasm,omitempty"`
}

// WasmSpec is a wasm operator whose module is an artifact.
type WasmSpec struct {
	Module     Artifact          `json:"module"`
	Config     map[string]string `json:"config,omitempty"`
	AllowClock bool              `json:"allow_clock,omitempty"`
	OnError    *jobfile.OnError  `json:"on_error,omitempty"`
}

// PinNewStart makes every nats source that starts at new start at the
// deploy time at instead (jobfile.PinNewStart): every attempt of the job,
// on whichever host, then starts where the first did. The source specs are
// copied.
func (s *JobSpec) PinNewStart(at time.Time) {
	for i := range s.Vertices {
		if src := s.Vertices[i].Source; src != nil {
			s.Vertices[i].Source = src.PinNewStart(at)
		}
	}
}

// OwnFiles makes the output of job id its own: every sink (dead-letter
// sinks too) gets it as jobfile.SinkSpec.Job (and the connector's
// SinkEnv.Job): a file sink puts it into its file names, a nats sink into
// its writer name. Checkpoints are the job's own by OpenStore. The sink
// specs are copied, not changed in place.
func (s *JobSpec) OwnFiles(id string) {
	for i := range s.Vertices {
		if sk := s.Vertices[i].Sink; sk != nil {
			own := *sk
			own.Job = id
			s.Vertices[i].Sink = &own
		}
		if w := s.Vertices[i].Wasm; w != nil && w.OnError != nil && w.OnError.DeadLetter != nil {
			oe, dl := *w.OnError, *w.OnError.DeadLetter
			dl.Job = id
			oe.DeadLetter = &dl
			ww := *w
			ww.OnError = &oe
			s.Vertices[i].Wasm = &ww
		}
	}
}

// Artifact is a file in the artifact object store, named by its content hash.
type Artifact struct {
	Name   string `json:"name"`   // the file's base name (kept for error messages and logs)
	Digest string `json:"digest"` // "sha256:<hex>"
	Size   int64  `json:"size"`
}

// Uploader stores the file at path and returns its artifact.
type Uploader func(path string) (Artifact, error)

// Resolver returns a local path holding the artifact's content.
type Resolver func(Artifact) (string, error)

// NewJobSpec turns a loaded job into a JobSpec, uploading every module and
// the input file of every file source. jobFile, if not empty, is uploaded too.
func NewJobSpec(job *jobfile.Job, jobFile string, upload Uploader) (JobSpec, error) {
	g := job.Graph
	s := JobSpec{Name: g.Name, Checkpoint: job.Checkpoint, Restart: job.Restart, MaxRecordBytes: job.MaxRecordBytes, State: job.State, Autoscaler: job.Autoscaler}
	if jobFile != "" {
		a, err := upload(jobFile)
		if err != nil {
			return JobSpec{}, err
		}
		s.JobFile = &a
	}
	uploaded := map[string]Artifact{}
	up := func(path string) (Artifact, error) {
		if a, ok := uploaded[path]; ok {
			return a, nil
		}
		a, err := upload(path)
		if err != nil {
			return Artifact{}, err
		}
		uploaded[path] = a
		return a, nil
	}
	for _, v := range g.Vertices {
		vs := VertexSpec{UID: v.UID, Kind: v.Kind, Parallelism: v.Parallelism, MaxParallelism: v.MaxParallelism, MinParallelism: v.MinParallelism, Inputs: v.Inputs}
		switch sp := v.Spec.(type) {
		case *jobfile.SourceSpec:
			c := *sp
			// A file the source reads on the hosts (a file source's
			// input), as its connector says.
			path, err := connector.SourceArtifact(&c)
			if err != nil {
				return JobSpec{}, fmt.Errorf("cluster: operator %q: %w", v.UID, err)
			}
			if path != "" {
				a, err := up(path)
				if err != nil {
					return JobSpec{}, fmt.Errorf("cluster: operator %q: input file: %w", v.UID, err)
				}
				vs.SourceFile = &a
			}
			vs.Source = &c
		case *jobfile.SinkSpec:
			c := *sp
			vs.Sink = &c
		case *jobfile.WasmSpec:
			a, err := up(sp.Path)
			if err != nil {
				return JobSpec{}, fmt.Errorf("cluster: operator %q: module: %w", v.UID, err)
			}
			vs.Wasm = &WasmSpec{Module: a, Config: sp.Config, AllowClock: sp.AllowClock, OnError: sp.OnError}
		default:
			return JobSpec{}, fmt.Errorf("cluster: operator %q: %T cannot be deployed (want a source, sink or wasm operator)", v.UID, v.Spec)
		}
		s.Vertices = append(s.Vertices, vs)
	}
	return s, nil
}

// Artifacts lists the artifacts the hosts must fetch to run s.
func (s *JobSpec) Artifacts() []Artifact {
	var out []Artifact
	for _, v := range s.Vertices {
		if v.SourceFile != nil {
			out = append(out, *v.SourceFile)
		}
		if v.Wasm != nil {
			out = append(out, v.Wasm.Module)
		}
	}
	return out
}

// Graph rebuilds and validates the job graph, with artifacts resolved to
// local paths.
func (s *JobSpec) Graph(resolve Resolver) (*control.JobGraph, error) {
	if len(s.Vertices) == 0 {
		return nil, errors.New("cluster: job spec has no operators")
	}
	vs := make([]*control.Vertex, 0, len(s.Vertices))
	for _, v := range s.Vertices {
		cv := &control.Vertex{UID: v.UID, Kind: v.Kind, Parallelism: v.Parallelism, MaxParallelism: v.MaxParallelism, MinParallelism: v.MinParallelism}
		for _, e := range v.Inputs {
			cv.Inputs = append(cv.Inputs, control.Edge{From: e.From, Partition: e.Partition, Output: e.Output})
		}
		n := 0
		if v.Source != nil {
			n++
			c := *v.Source
			if v.SourceFile != nil {
				p, err := resolve(*v.SourceFile)
				if err != nil {
					return nil, fmt.Errorf("cluster: operator %q: input file: %w", v.UID, err)
				}
				if err := connector.WithSourceArtifact(&c, p); err != nil {
					return nil, fmt.Errorf("cluster: operator %q: %w", v.UID, err)
				}
			}
			cv.Spec = &c
		}
		if v.Sink != nil {
			n++
			c := *v.Sink
			cv.Spec = &c
		}
		if v.Wasm != nil {
			n++
			p, err := resolve(v.Wasm.Module)
			if err != nil {
				return nil, fmt.Errorf("cluster: operator %q: module: %w", v.UID, err)
			}
			cv.Spec = &jobfile.WasmSpec{Path: p, Config: v.Wasm.Config, AllowClock: v.Wasm.AllowClock, OnError: v.Wasm.OnError}
		}
		if n != 1 {
			return nil, fmt.Errorf("cluster: operator %q: want exactly one of source, sink and wasm, got %d", v.UID, n)
		}
		vs = append(vs, cv)
	}
	g, err := control.NewJobGraph(s.Name, vs)
	if err != nil {
		return nil, fmt.Errorf("cluster: job %q: %w", s.Name, err)
	}
	return g, nil
}

// SlotsNeeded is the largest parallelism (control.SlotsNeeded without a graph).
func (s *JobSpec) SlotsNeeded() int {
	n := 0
	for _, v := range s.Vertices {
		n = max(n, v.Parallelism)
	}
	return n
}
