package connector

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"
)

// Field types of a ConfigSpec, as a job file writes them.
const (
	TypeString     = "string"
	TypeInt        = "int"      // an integer (int64)
	TypeFloat      = "float"    // a number
	TypeBool       = "bool"     // true or false
	TypeDuration   = "duration" // a Go duration like 500ms or 1m, or 0
	TypeMillis     = "millis"   // a duration, or an integer number of milliseconds
	TypePath       = "path"     // a file path, resolved against the job file's directory ("-" stays "-")
	TypeStringList = "string list"
	TypeStringMap  = "string map" // a mapping of names to strings
	TypeObject     = "object"     // a mapping with fields of its own (Field.Fields)
)

// Field is one field of a connector's configuration. Make it with a
// New...Field function and chain the setters.
type Field struct {
	Name         string
	Type         string
	Doc          string
	DefaultValue any   // nil: no default
	Examples     []any // for the docs
	// Required makes a missing field an error; MissingHint says what the
	// field is for in that error ("missing: <hint>").
	Required    bool
	MissingHint string
	// Enum, when set, lists the values a string field may take; EnumWhat
	// names them in errors ("unknown <what> %q (want a or b)").
	Enum     []string
	EnumWhat string
	Fields   []*Field // TypeObject
}

func newField(name, typ string) *Field { return &Field{Name: name, Type: typ} }

// NewStringField and the other New...Field functions make a field of the type their name says.
func NewStringField(name string) *Field     { return newField(name, TypeString) }
func NewIntField(name string) *Field        { return newField(name, TypeInt) }
func NewFloatField(name string) *Field      { return newField(name, TypeFloat) }
func NewBoolField(name string) *Field       { return newField(name, TypeBool) }
func NewDurationField(name string) *Field   { return newField(name, TypeDuration) }
func NewMillisField(name string) *Field     { return newField(name, TypeMillis) }
func NewPathField(name string) *Field       { return newField(name, TypePath) }
func NewStringListField(name string) *Field { return newField(name, TypeStringList) }
func NewStringMapField(name string) *Field  { return newField(name, TypeStringMap) }

// NewObjectField is a nested mapping with fields of its own.
func NewObjectField(name string, fields ...*Field) *Field {
	f := newField(name, TypeObject)
	f.Fields = fields
	return f
}

// Description sets the field's documentation (one sentence or a few).
func (f *Field) Description(doc string) *Field { f.Doc = doc; return f }

// Default sets the value of the field when it is left out (the docs show it).
func (f *Field) Default(v any) *Field { f.DefaultValue = v; return f }

// Example adds an example value for the docs.
func (f *Field) Example(v any) *Field { f.Examples = append(f.Examples, v); return f }

// Require makes the field required; hint completes "missing: ...".
func (f *Field) Require(hint string) *Field { f.Required, f.MissingHint = true, hint; return f }

// OneOf restricts a string field to values, named what in errors.
func (f *Field) OneOf(what string, values ...string) *Field {
	f.Enum, f.EnumWhat = values, what
	return f
}

// FieldError is a problem a Check hook found in a field (Field is a path
// like "start" or "tls.ca_file"; "" is the whole mapping).
type FieldError struct {
	Field   string
	Message string
}

// Errorf makes a FieldError.
func Errorf(field, format string, args ...any) FieldError {
	return FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// ConfigSpec describes a source or sink type: its fields and the hooks the
// loader, the deployer, validate and the runtime call (see the package's
// registry doc). Build it with NewConfigSpec and the chained setters.
type ConfigSpec struct {
	summary     string
	description string
	fields      []*Field
	example     string

	// timestamp: the source takes timestamp: {field: NAME} (every source
	// takes watermark and watermark_lag).
	timestamp   bool
	usesNATS    bool
	deadLetters bool
	// builtin: a type from before the registry, whose values are in the
	// typed fields of SourceSpec or SinkSpec (bind puts them there) rather
	// than in Config, so that job specs and checkpoints of earlier
	// versions read the same. New types leave it false.
	builtin    bool
	bindSource func(c Config, s *SourceSpec)
	bindSink   func(c Config, s *SinkSpec)

	checkFn         func(c Config) []FieldError
	describeSource  func(s *SourceSpec) string
	describeSink    func(s *SinkSpec) string
	artifact        func(s *SourceSpec) (string, error)
	withArtifact    func(s *SourceSpec, local string)
	rescale         func(positions [][]byte, parallelism int) ([][]byte, error)
	restoreFinished func(s *SinkSpec, env SinkEnv, r FinishedRestore) error
	transformInput  func(s *SourceSpec) (*SourceSpec, error)
	transformOutput func(in *SourceSpec, out *SinkSpec) (string, error)
}

// FinishedRestore is what a sink subtask restored as finished (it runs no
// Write) knows of the checkpoint it restores from.
type FinishedRestore struct {
	JobID        string   // the id of the job that wrote the checkpoint
	CheckpointID int64    // the checkpoint's id
	Pending      [][]byte // the PreCommit states of the sink in it
}

// NewConfigSpec starts an empty spec.
func NewConfigSpec() *ConfigSpec { return &ConfigSpec{} }

// Summary is the one line the docs table and `streamd validate` show.
func (c *ConfigSpec) Summary(s string) *ConfigSpec { c.summary = s; return c }

// Description is the docs' longer text (Markdown).
func (c *ConfigSpec) Description(s string) *ConfigSpec { c.description = s; return c }

// Field adds fields, in the order the docs list them.
func (c *ConfigSpec) Field(fs ...*Field) *ConfigSpec { c.fields = append(c.fields, fs...); return c }

// Example is a YAML example of the connector's mapping for the docs.
func (c *ConfigSpec) Example(yaml string) *ConfigSpec { c.example = yaml; return c }

// EventTimestamp marks a source that takes timestamp: {field: NAME} (the
// event time from a JSON field of the value).
func (c *ConfigSpec) EventTimestamp() *ConfigSpec { c.timestamp = true; return c }

// UsesNATS marks a connector that connects with the runtime's nats.*
// settings (streamd run then starts or reaches a NATS server).
func (c *ConfigSpec) UsesNATS() *ConfigSpec { c.usesNATS = true; return c }

// DeadLetters marks a two-phase-commit sink that may take an operator's
// dead letters (they are written exactly once).
func (c *ConfigSpec) DeadLetters() *ConfigSpec { c.deadLetters = true; return c }

// Check adds a check of the values beyond types, Required and OneOf (a
// field that needs another, a file that must exist). The loader reports
// each FieldError at the field's line.
func (c *ConfigSpec) Check(fn func(c Config) []FieldError) *ConfigSpec { c.checkFn = fn; return c }

// DescribeSource sets how `streamd validate` and status describe a source
// ("source nats stream ORDERS"); the default lists the fields given.
func (c *ConfigSpec) DescribeSource(fn func(s *SourceSpec) string) *ConfigSpec {
	c.describeSource = fn
	return c
}

// DescribeSink is DescribeSource for a sink.
func (c *ConfigSpec) DescribeSink(fn func(s *SinkSpec) string) *ConfigSpec {
	c.describeSink = fn
	return c
}

// Artifact names a local file a deployed source needs on the hosts (the
// file source's input): artifact returns its path ("" none, or an error
// when the source cannot be deployed), and with sets the path of the
// host's copy on the host's spec.
func (c *ConfigSpec) Artifact(artifact func(s *SourceSpec) (string, error), with func(s *SourceSpec, local string)) *ConfigSpec {
	c.artifact, c.withArtifact = artifact, with
	return c
}

// RescalePositions lets a source restore at another parallelism: given the
// positions of the old subtasks (nil for a subtask that had none), it
// returns the positions of parallelism new ones.
func (c *ConfigSpec) RescalePositions(fn func(positions [][]byte, parallelism int) ([][]byte, error)) *ConfigSpec {
	c.rescale = fn
	return c
}

// RestoreFinished sets how a sink subtask restored as finished commits what
// the failed attempt left pending (see the registry doc for the default).
func (c *ConfigSpec) RestoreFinished(fn func(s *SinkSpec, env SinkEnv, r FinishedRestore) error) *ConfigSpec {
	c.restoreFinished = fn
	return c
}

// bindSourceFields and bindSinkFields make a built-in type (see builtin).
func (c *ConfigSpec) bindSourceFields(fn func(Config, *SourceSpec)) *ConfigSpec {
	c.builtin, c.bindSource = true, fn
	return c
}

func (c *ConfigSpec) bindSinkFields(fn func(Config, *SinkSpec)) *ConfigSpec {
	c.builtin, c.bindSink = true, fn
	return c
}

// Fields are the spec's fields in order.
func (c *ConfigSpec) Fields() []*Field { return c.fields }

// TakesTimestamp reports EventTimestamp.
func (c *ConfigSpec) TakesTimestamp() bool { return c.timestamp }

// TakesDeadLetters reports DeadLetters.
func (c *ConfigSpec) TakesDeadLetters() bool { return c.deadLetters }

// CheckConfig runs the Check hook.
func (c *ConfigSpec) CheckConfig(cfg Config) []FieldError {
	if c.checkFn == nil {
		return nil
	}
	return c.checkFn(cfg)
}

var (
	typeName  = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	fieldName = typeName
	// reserved are the fields every source or sink mapping has.
	reserved = []string{"type", "timestamp", "watermark", "watermark_lag"}
)

// check validates the spec itself when it is registered.
func (c *ConfigSpec) check() error {
	if c.summary == "" {
		return fmt.Errorf("no summary")
	}
	return checkFields(c.fields, "")
}

func checkFields(fs []*Field, prefix string) error {
	seen := map[string]bool{}
	for _, f := range fs {
		name := prefix + f.Name
		if !fieldName.MatchString(f.Name) {
			return fmt.Errorf("field %q: want a lower-case name like topic or max_bytes", name)
		}
		if seen[f.Name] || (prefix == "" && contains(reserved, f.Name)) {
			return fmt.Errorf("field %q given twice (type, timestamp, watermark and watermark_lag are every connector's)", name)
		}
		seen[f.Name] = true
		if f.Doc == "" {
			return fmt.Errorf("field %q has no description", name)
		}
		switch f.Type {
		case TypeString, TypeInt, TypeFloat, TypeBool, TypeDuration, TypeMillis, TypePath, TypeStringList, TypeStringMap:
			if len(f.Fields) > 0 {
				return fmt.Errorf("field %q: only an object has fields", name)
			}
		case TypeObject:
			if err := checkFields(f.Fields, name+"."); err != nil {
				return err
			}
		default:
			return fmt.Errorf("field %q: unknown type %q", name, f.Type)
		}
		if len(f.Enum) > 0 && f.Type != TypeString {
			return fmt.Errorf("field %q: only a string field takes OneOf", name)
		}
		if f.Required && f.DefaultValue != nil {
			return fmt.Errorf("field %q is required and has a default", name)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Config holds a connector's values by field name, as the loader read and
// checked them: string, int64, float64, bool, time.Duration, []string,
// map[string]string, or a Config for an object field. Fields left out
// hold their Default. It travels as JSON (a deployed job's spec); the
// accessors also read the values JSON gives back.
type Config map[string]any

// Has reports whether field name has a value (given, or a default).
func (c Config) Has(name string) bool { _, ok := c[name]; return ok }

// String is a string (or path) field; "" when unset.
func (c Config) String(name string) string {
	s, _ := c[name].(string)
	return s
}

// Int is an integer field; 0 when unset.
func (c Config) Int(name string) int64 {
	switch v := c[name].(type) {
	case int64:
		return v
	case int:
		return int64(v)
	case float64:
		return int64(v)
	case json.Number:
		n, _ := v.Int64()
		return n
	}
	return 0
}

// Float is a number field; 0 when unset.
func (c Config) Float(name string) float64 {
	switch v := c[name].(type) {
	case float64:
		return v
	case int64:
		return float64(v)
	case int:
		return float64(v)
	case json.Number:
		f, _ := v.Float64()
		return f
	}
	return 0
}

// Bool is a bool field; false when unset.
func (c Config) Bool(name string) bool {
	b, _ := c[name].(bool)
	return b
}

// Duration is a duration or millis field; 0 when unset.
func (c Config) Duration(name string) time.Duration {
	switch v := c[name].(type) {
	case time.Duration:
		return v
	case string:
		d, _ := time.ParseDuration(v)
		return d
	}
	return time.Duration(c.Int(name))
}

// StringList is a string-list field; nil when unset.
func (c Config) StringList(name string) []string {
	switch v := c[name].(type) {
	case []string:
		return v
	case []any:
		out := make([]string, 0, len(v))
		for _, x := range v {
			s, _ := x.(string)
			out = append(out, s)
		}
		return out
	}
	return nil
}

// StringMap is a string-map field; nil when unset.
func (c Config) StringMap(name string) map[string]string {
	switch v := c[name].(type) {
	case map[string]string:
		return v
	case map[string]any:
		out := make(map[string]string, len(v))
		for k, x := range v {
			out[k], _ = x.(string)
		}
		return out
	}
	return nil
}

// Object is an object field's values; nil when unset.
func (c Config) Object(name string) Config {
	switch v := c[name].(type) {
	case Config:
		return v
	case map[string]any:
		return Config(v)
	}
	return nil
}

// UnmarshalJSON reads numbers as json.Number, so that large integers keep
// every digit.
func (c *Config) UnmarshalJSON(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return err
	}
	*c = m
	return nil
}

// MarshalJSON writes durations as Go durations ("1.5s"), which Duration
// reads back.
func (c Config) MarshalJSON() ([]byte, error) {
	if c == nil {
		return []byte("null"), nil
	}
	m := make(map[string]any, len(c))
	for k, v := range c {
		if d, ok := v.(time.Duration); ok {
			v = d.String()
		}
		m[k] = v
	}
	return json.Marshal(m)
}

// formatValue spells a value as a job file would (docs and describe).
func formatValue(v any) string {
	switch x := v.(type) {
	case string:
		if x == "" {
			return `""`
		}
		return x
	case float64:
		if math.Trunc(x) == x && math.Abs(x) < 1e15 {
			return strconv.FormatFloat(x, 'f', -1, 64)
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	case []string:
		b, _ := json.Marshal(x)
		return string(b)
	case Config, map[string]string, map[string]any, []any:
		b, _ := json.Marshal(x)
		return string(b)
	}
	return fmt.Sprint(v)
}
