package jobfile

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const onErrorHead = "name: dl\noperators:\n  - uid: lines\n    source: {type: file, path: input.txt}\n  - uid: parse\n    wasm: mods/count.wasm\n    inputs: [lines]\n"

// TestOnErrorFields: on_error, dead_letter and max_dead_letters of a wasm
// operator are read into WasmSpec.OnError; without on_error it is nil.
func TestOnErrorFields(t *testing.T) {
	for _, c := range []struct {
		fields string
		want   func(dir string) *OnError
	}{
		{"", func(string) *OnError { return nil }},
		{"    on_error: fail\n", func(string) *OnError { return nil }},
		{"    on_error: skip\n    max_dead_letters: 10\n", func(string) *OnError {
			return &OnError{Mode: OnErrorSkip, Max: DeadLetterLimit{Count: 10}}
		}},
		{"    on_error: dead_letter\n    dead_letter: {type: file, path: dead/}\n    max_dead_letters: 100/1m\n", func(dir string) *OnError {
			return &OnError{Mode: OnErrorDeadLetter, DeadLetter: &SinkSpec{Type: "file", Path: filepath.Join(dir, "dead"), Format: "value"},
				Max: DeadLetterLimit{Count: 100, Per: time.Minute}}
		}},
		{"    on_error: dead_letter\n    dead_letter: {type: nats, subject: dead.parse}\n    max_dead_letters: \"5/s\"\n", func(string) *OnError {
			return &OnError{Mode: OnErrorDeadLetter, DeadLetter: &SinkSpec{Type: "nats", Subject: "dead.parse", Format: "value"},
				Max: DeadLetterLimit{Count: 5, Per: time.Second}}
		}},
	} {
		path := fixture(t, onErrorHead+c.fields)
		job, err := LoadJob(path, Options{})
		if err != nil {
			t.Fatalf("%q: %v", c.fields, err)
		}
		got := job.Graph.Vertex("parse").Spec.(*WasmSpec).OnError
		if want := c.want(filepath.Dir(path)); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: on_error %+v, want %+v", c.fields, got, want)
		}
	}
}

// TestOnErrorInvalid: every mistake in on_error, dead_letter and
// max_dead_letters is refused with the field and the reason.
func TestOnErrorInvalid(t *testing.T) {
	for _, c := range []struct {
		name, fields, want string
	}{
		{"unknown mode", "    on_error: ignore\n", `operator "parse" (line 8): on_error: unknown mode "ignore" (want fail, skip or dead_letter)`},
		{"dead_letter missing", "    on_error: dead_letter\n", `operator "parse" (line 8): dead_letter: missing: on_error dead_letter sends the failing records to a dead_letter sink`},
		{"dead_letter with fail", "    dead_letter: {type: file, path: dead/}\n", `operator "parse" (line 8): dead_letter: only with on_error: dead_letter`},
		{"dead_letter with skip", "    on_error: skip\n    dead_letter: {type: file, path: dead/}\n", `operator "parse" (line 9): dead_letter: only with on_error: dead_letter (on_error skip drops the failing records)`},
		{"max with fail", "    max_dead_letters: 3\n", `operator "parse" (line 8): max_dead_letters: only with on_error: skip or dead_letter`},
		{"stdout dead letters", "    on_error: dead_letter\n    dead_letter: {type: stdout}\n", `operator "parse" (line 9): dead_letter.type: a stdout sink cannot take dead letters: they are written exactly once, by a file or nats sink`},
		{"dead_letter field", "    on_error: dead_letter\n    dead_letter: {type: file}\n", `operator "parse" (line 9): dead_letter.path: missing: a file sink writes part files`},
		{"dead_letter unknown type", "    on_error: dead_letter\n    dead_letter: {type: kafka, path: x/}\n", `dead_letter.type: unknown sink type "kafka"`},
		{"max zero", "    on_error: skip\n    max_dead_letters: 0\n", `operator "parse" (line 9): max_dead_letters: "0": the count must be a whole number of at least 1; want a count like 100 or a rate like 100/1m`},
		{"max bad window", "    on_error: skip\n    max_dead_letters: 10/soon\n", `max_dead_letters: "10/soon": the window "soon" is not a positive duration like 1m or 30s`},
		{"max not scalar", "    on_error: skip\n    max_dead_letters: [1]\n", `max_dead_letters: want a count like 100 or a rate like 100/1m, got a list`},
		{"on a sink", "  - uid: out\n    sink: {type: stdout}\n    on_error: skip\n    inputs: [parse]\n", `operator "out" (line 10): on_error: only a wasm operator takes on_error`},
		{"shared directory", "    on_error: dead_letter\n    dead_letter: {type: file, path: out/}\n  - uid: out\n    sink: {type: file, path: out/}\n    inputs: [parse]\n",
			`operator "parse" (line 9): dead_letter.path: `},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadJob(fixture(t, onErrorHead+c.fields), Options{Filename: "dl.yaml"})
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
}
