package connector

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// SourceEnv is what the runtime gives a source's constructor.
type SourceEnv struct {
	Context     context.Context
	Operator    string // the operator's uid
	Job         string // the job's name (streamd run) or deployed id
	Subtask     int
	Parallelism int
	// Position is nil on a first start, else the Position() of this
	// subtask's source in the checkpoint restored from.
	Position       []byte
	MaxRecordBytes int       // the job's max_record_bytes
	Stdin          io.Reader // standard input (a file source's "-")
	// NATS returns the runtime's shared connection to the servers url
	// ("" = the configured nats.url), for a spec marked UsesNATS.
	NATS func(url string) (*nats.Conn, error)
	// Settings are the values of the registered configuration keys
	// (RegisterSetting) that the process's configuration sets.
	Settings map[string]string
}

// SinkEnv is what the runtime gives a sink's constructor.
type SinkEnv struct {
	Context context.Context
	// Operator is the operator's uid, or "<uid>.dead_letter" for an
	// operator's dead-letter sink.
	Operator    string
	Job         string // the job's name, or its id when deployed (SinkSpec.Job when set)
	Subtask     int
	Parallelism int
	// Checkpointing is false for a job without checkpoints: a two-phase
	// sink then gets CommitFinal at the end instead of Commit.
	Checkpointing bool
	// CheckpointInterval is the job's periodic checkpoint interval; 0:
	// none, or not known here.
	CheckpointInterval time.Duration
	Stdout             io.Writer   // the process's standard output
	StdoutMu           *sync.Mutex // held while writing Stdout
	NATS               func(url string) (*nats.Conn, error)
	Settings           map[string]string // see SourceEnv.Settings
}

// SourceConstructor makes one subtask of a source from its spec (the
// built-in types read the typed fields of SourceSpec, registered types
// spec.Config).
type SourceConstructor func(spec *SourceSpec, env SourceEnv) (Source, error)

// SinkConstructor makes one subtask of a sink.
type SinkConstructor func(spec *SinkSpec, env SinkEnv) (Sink, error)

// Plugin is a registered source or sink type.
type Plugin struct {
	Name   string
	Kind   string // "source" or "sink"
	Spec   *ConfigSpec
	source SourceConstructor
	sink   SinkConstructor
}

var registry = struct {
	sync.RWMutex
	sources, sinks []*Plugin // in registration order
}{}

// RegisterSource adds source type name. It fails on a name given twice, a
// spec whose fields are not valid or a nil constructor; call it from an
// init function (MustRegisterSource panics instead).
func RegisterSource(name string, spec *ConfigSpec, ctor SourceConstructor) error {
	if ctor == nil {
		return fmt.Errorf("connector: source %q: no constructor", name)
	}
	return register(&Plugin{Name: name, Kind: "source", Spec: spec, source: ctor})
}

// RegisterSink adds sink type name, as RegisterSource.
func RegisterSink(name string, spec *ConfigSpec, ctor SinkConstructor) error {
	if ctor == nil {
		return fmt.Errorf("connector: sink %q: no constructor", name)
	}
	return register(&Plugin{Name: name, Kind: "sink", Spec: spec, sink: ctor})
}

// MustRegisterSource is RegisterSource for init functions.
func MustRegisterSource(name string, spec *ConfigSpec, ctor SourceConstructor) {
	if err := RegisterSource(name, spec, ctor); err != nil {
		panic(err)
	}
}

// MustRegisterSink is RegisterSink for init functions.
func MustRegisterSink(name string, spec *ConfigSpec, ctor SinkConstructor) {
	if err := RegisterSink(name, spec, ctor); err != nil {
		panic(err)
	}
}

func register(p *Plugin) error {
	if p.Name == "" || !typeName.MatchString(p.Name) {
		return fmt.Errorf("connector: %s type %q: want a lower-case name like kafka or my_source", p.Kind, p.Name)
	}
	if p.Spec == nil {
		return fmt.Errorf("connector: %s %q: no config spec", p.Kind, p.Name)
	}
	if err := p.Spec.check(); err != nil {
		return fmt.Errorf("connector: %s %q: %w", p.Kind, p.Name, err)
	}
	registry.Lock()
	defer registry.Unlock()
	list := &registry.sources
	if p.Kind == "sink" {
		list = &registry.sinks
	}
	for _, q := range *list {
		if q.Name == p.Name {
			return fmt.Errorf("connector: %s type %q is registered twice", p.Kind, p.Name)
		}
	}
	*list = append(*list, p)
	return nil
}

// Unregister removes source or sink type name (kind "source" or "sink"):
// for tests that register a type for a while.
func Unregister(kind, name string) {
	registry.Lock()
	defer registry.Unlock()
	list := &registry.sources
	if kind == "sink" {
		list = &registry.sinks
	}
	*list = slices.DeleteFunc(*list, func(p *Plugin) bool { return p.Name == name })
}

// LookupSource returns the registered source type name.
func LookupSource(name string) (*Plugin, bool) { return lookup(&registry.sources, name) }

// LookupSink returns the registered sink type name.
func LookupSink(name string) (*Plugin, bool) { return lookup(&registry.sinks, name) }

func lookup(list *[]*Plugin, name string) (*Plugin, bool) {
	registry.RLock()
	defer registry.RUnlock()
	for _, p := range *list {
		if p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// Sources lists the registered source types: the built-in ones first, in
// the order the docs give them, then the others by name.
func Sources() []*Plugin { return listed(&registry.sources) }

// Sinks lists the registered sink types, as Sources.
func Sinks() []*Plugin { return listed(&registry.sinks) }

func listed(list *[]*Plugin) []*Plugin {
	registry.RLock()
	out := slices.Clone(*list)
	registry.RUnlock()
	sort.SliceStable(out, func(i, j int) bool {
		bi, bj := out[i].Spec.builtin, out[j].Spec.builtin
		if bi != bj {
			return bi
		}
		return !bi && out[i].Name < out[j].Name
	})
	return out
}

// SourceNames and SinkNames are the registered type names, as Sources
// orders them.
func SourceNames() []string { return names(Sources()) }

// SinkNames: see SourceNames.
func SinkNames() []string { return names(Sinks()) }

func names(ps []*Plugin) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

// NewSource makes a subtask of the source spec describes.
func NewSource(spec *SourceSpec, env SourceEnv) (Source, error) {
	p, ok := LookupSource(spec.Type)
	if !ok {
		return nil, fmt.Errorf("unknown source type %q", spec.Type)
	}
	if env.Context == nil {
		env.Context = context.Background()
	}
	return p.source(spec, env)
}

// NewSink makes a subtask of the sink spec describes.
func NewSink(spec *SinkSpec, env SinkEnv) (Sink, error) {
	p, ok := LookupSink(spec.Type)
	if !ok {
		return nil, fmt.Errorf("unknown sink type %q", spec.Type)
	}
	if env.Context == nil {
		env.Context = context.Background()
	}
	if spec.Job != "" {
		env.Job = spec.Job
	}
	return p.sink(spec, env)
}

// BindSource sets s (whose Type is p's) from the checked values c.
func (p *Plugin) BindSource(c Config, s *SourceSpec) {
	if p.Spec.bindSource == nil {
		s.Config = &c
		return
	}
	legacySourceDefaults(s)
	p.Spec.bindSource(c, s)
}

// BindSink sets s (whose Type is p's) from the checked values c.
func (p *Plugin) BindSink(c Config, s *SinkSpec) {
	s.Format = "value" // every sink spec has had it
	if p.Spec.bindSink == nil {
		s.Config = &c
		return
	}
	p.Spec.bindSink(c, s)
}

// DescribeSource is the one line validate and status show for a source:
// its spec's DescribeSource, else "source TYPE" and the fields given.
func DescribeSource(s *SourceSpec) string {
	p, ok := LookupSource(s.Type)
	if ok && p.Spec.describeSource != nil {
		return p.Spec.describeSource(s)
	}
	return "source " + s.Type + describeConfig(p, s.Conf())
}

// DescribeSink is DescribeSource for a sink.
func DescribeSink(s *SinkSpec) string {
	p, ok := LookupSink(s.Type)
	if ok && p.Spec.describeSink != nil {
		return p.Spec.describeSink(s)
	}
	return "sink " + s.Type + describeConfig(p, s.Conf())
}

// Describe is DescribeSource or DescribeSink of spec, "" when spec is
// neither a *SourceSpec nor a *SinkSpec.
func Describe(spec any) string {
	switch s := spec.(type) {
	case *SourceSpec:
		return DescribeSource(s)
	case *SinkSpec:
		return DescribeSink(s)
	}
	return ""
}

// describeConfig lists the values that differ from their default, in the
// spec's order.
func describeConfig(p *Plugin, c Config) string {
	if p == nil {
		return ""
	}
	d := ""
	for _, f := range p.Spec.fields {
		v, ok := c[f.Name]
		if !ok || (f.DefaultValue != nil && formatValue(v) == formatValue(f.DefaultValue)) {
			continue
		}
		d += " " + f.Name + "=" + formatValue(v)
	}
	return d
}

// UsesNATS reports whether spec (a *SourceSpec or *SinkSpec) is of a type
// that connects with the runtime's nats.* settings.
func UsesNATS(spec any) bool {
	var p *Plugin
	switch s := spec.(type) {
	case *SourceSpec:
		p, _ = LookupSource(s.Type)
	case *SinkSpec:
		p, _ = LookupSink(s.Type)
	}
	return p != nil && p.Spec.usesNATS
}

// SourceArtifact is the local file a deployed source needs on the hosts
// ("" none), or why s cannot be deployed.
func SourceArtifact(s *SourceSpec) (string, error) {
	p, ok := LookupSource(s.Type)
	if !ok {
		return "", fmt.Errorf("unknown source type %q", s.Type)
	}
	if p.Spec.artifact == nil {
		return "", nil
	}
	return p.Spec.artifact(s)
}

// WithSourceArtifact sets the host's local copy of s's artifact into s.
func WithSourceArtifact(s *SourceSpec, local string) error {
	p, ok := LookupSource(s.Type)
	if !ok || p.Spec.withArtifact == nil {
		return fmt.Errorf("source type %q takes no file", s.Type)
	}
	p.Spec.withArtifact(s, local)
	return nil
}

// SourceRescales reports whether source type typ can restore at another
// parallelism (its spec has RescalePositions).
func SourceRescales(typ string) bool {
	p, ok := LookupSource(typ)
	return ok && p.Spec.rescale != nil
}

// RescaleSourcePositions spreads the positions of a source's old subtasks
// over parallelism new ones, for a type whose spec has RescalePositions;
// ok is false for the others (their parallelism is fixed once
// checkpointed).
func RescaleSourcePositions(typ string, positions [][]byte, parallelism int) (out [][]byte, ok bool, err error) {
	p, found := LookupSource(typ)
	if !found || p.Spec.rescale == nil {
		return nil, false, nil
	}
	out, err = p.Spec.rescale(positions, parallelism)
	if err == nil && len(out) != parallelism {
		err = fmt.Errorf("source %q: %d positions for parallelism %d", typ, len(out), parallelism)
	}
	return out, true, err
}

// RestoreFinishedSink commits what a sink subtask restored as finished
// left pending (see the registry doc).
func RestoreFinishedSink(s *SinkSpec, env SinkEnv, r FinishedRestore) error {
	p, ok := LookupSink(s.Type)
	if !ok {
		return fmt.Errorf("unknown sink type %q", s.Type)
	}
	if p.Spec.restoreFinished != nil {
		return p.Spec.restoreFinished(s, env, r)
	}
	if len(r.Pending) == 0 {
		return nil
	}
	sink, err := NewSink(s, env)
	if err != nil {
		return err
	}
	if tp, ok := sink.(TwoPhaseSink); ok {
		err = tp.CommitPending(r.Pending)
	}
	if cerr := sink.Close(); err == nil {
		err = cerr
	}
	return err
}

// Setting is a configuration key a connector reads (kafka.brokers): the
// CLI accepts it in the configuration file and as STREAMD_KAFKA_BROKERS,
// and, when Flag is set, as a flag of streamd run and deploy
// (--kafka-brokers); its value reaches SourceEnv.Settings,
// SinkEnv.Settings and SchemeEnv.Settings.
type Setting struct {
	Key   string // "kafka.brokers": lower case, dotted
	Flag  string // "kafka-brokers"; "" none
	Usage string // the flag's help and the docs' line
}

var settings []Setting

var settingKey = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$`)

// RegisterSetting adds a configuration key (from an init function).
func RegisterSetting(s Setting) error {
	if !settingKey.MatchString(s.Key) || s.Usage == "" {
		return fmt.Errorf("connector: setting %q: want a dotted lower-case key like kafka.brokers and a usage", s.Key)
	}
	for _, q := range settings {
		if q.Key == s.Key || (s.Flag != "" && q.Flag == s.Flag) {
			return fmt.Errorf("connector: setting %q (flag %q) is registered twice", s.Key, s.Flag)
		}
	}
	settings = append(settings, s)
	return nil
}

// Settings lists the registered configuration keys.
func Settings() []Setting { return slices.Clone(settings) }
