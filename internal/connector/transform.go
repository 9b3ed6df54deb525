package connector

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A transform is `streamd deploy MODULE.wasm --input SCHEME:ARG --output
// SCHEME:ARG` (like rpk transform deploy): one source, the module, a sink
// per output. The schemes come from the registry too: a connector that
// can be a transform's input or output registers a Scheme beside its type
// (RegisterScheme), and its ConfigSpec's TransformInput or TransformOutput
// checks the spec the scheme made (jobfile.FilterJob calls them).

// Scheme is a URL scheme of streamd deploy's --input or --output.
type Scheme struct {
	Name  string // before the ':': "nats", "jetstream", "kafka"
	Usage string // as help and errors spell it: "nats:SUBJECT"
	// Input makes the transform's source from ARG; nil: not an input
	// scheme.
	Input func(arg string, env SchemeEnv) (*SourceSpec, error)
	// Output makes a sink from ARG; nil: not an output scheme.
	Output func(arg string, env SchemeEnv) (*SinkSpec, error)
	// Prepare, when set, readies what the spec needs before the job is
	// deployed (finds or creates a stream): the deployer calls it for the
	// input and every output first with create false (check only, may
	// complete the spec, creates nothing), then with create true, so a
	// refused deploy leaves nothing behind. The note (create true) is
	// printed on stderr.
	Prepare func(ctx context.Context, env DeployEnv, create bool) (note string, err error)
}

// SchemeEnv is what a Scheme's Input and Output get.
type SchemeEnv struct {
	Start    string            // --start; "" when not given
	Settings map[string]string // the registered settings the configuration (or a flag) sets
}

// DeployEnv is what a Scheme's Prepare gets.
type DeployEnv struct {
	NATS   *nats.Conn  // the deploying client's connection
	Input  *SourceSpec // the transform's input (Prepare of the input may complete it)
	Output *SinkSpec   // the output being prepared; nil when preparing the input
}

// FlagError is a problem with a flag of a transform ("--start").
type FlagError struct {
	Flag    string
	Message string
}

func (e *FlagError) Error() string { return e.Flag + ": " + e.Message }

func flagErrorf(flag, format string, args ...any) error {
	return &FlagError{Flag: flag, Message: fmt.Sprintf(format, args...)}
}

var schemes struct {
	list []*Scheme
}

// RegisterScheme adds a --input/--output scheme (from an init function,
// or a registration like the built-ins'; not concurrently with deploys).
func RegisterScheme(s Scheme) error {
	if !typeName.MatchString(s.Name) || s.Usage == "" || (s.Input == nil && s.Output == nil) {
		return fmt.Errorf("connector: scheme %q: want a lower-case name, a usage and Input or Output", s.Name)
	}
	for _, q := range schemes.list {
		if q.Name == s.Name && (q.Input != nil && s.Input != nil || q.Output != nil && s.Output != nil) {
			return fmt.Errorf("connector: scheme %q is registered twice", s.Name)
		}
	}
	schemes.list = append(schemes.list, &s)
	return nil
}

// InputScheme and OutputScheme find the scheme of SCHEME:ARG.
func InputScheme(name string) (*Scheme, bool) {
	i := slices.IndexFunc(schemes.list, func(s *Scheme) bool { return s.Name == name && s.Input != nil })
	if i < 0 {
		return nil, false
	}
	return schemes.list[i], true
}

// OutputScheme: see InputScheme.
func OutputScheme(name string) (*Scheme, bool) {
	i := slices.IndexFunc(schemes.list, func(s *Scheme) bool { return s.Name == name && s.Output != nil })
	if i < 0 {
		return nil, false
	}
	return schemes.list[i], true
}

// InputUsages and OutputUsages are the schemes' usages, for messages.
func InputUsages() []string  { return usages(func(s *Scheme) bool { return s.Input != nil }) }
func OutputUsages() []string { return usages(func(s *Scheme) bool { return s.Output != nil }) }

func usages(ok func(*Scheme) bool) []string {
	var out []string
	for _, s := range schemes.list {
		if ok(s) {
			out = append(out, s.Usage)
		}
	}
	return out
}

// TransformInput checks and completes a transform's input spec (its type's
// ConfigSpec.TransformInput); an error is a *FlagError.
func TransformInput(s *SourceSpec) (*SourceSpec, error) {
	p, ok := LookupSource(s.Type)
	if !ok || p.Spec.transformInput == nil {
		return nil, fmt.Errorf("a %q source cannot be a transform's input", s.Type)
	}
	return p.Spec.transformInput(s)
}

// TransformOutput checks a transform's output spec and returns its name:
// the scheme's argument ("nats:NAME"), which also names the sink's
// operator; an error is a *FlagError.
func TransformOutput(in *SourceSpec, s *SinkSpec) (string, error) {
	p, ok := LookupSink(s.Type)
	if !ok || p.Spec.transformOutput == nil {
		return "", fmt.Errorf("a %q sink cannot be a transform's output", s.Type)
	}
	return p.Spec.transformOutput(in, s)
}

// TransformInput sets the check of a transform's input of this type.
func (c *ConfigSpec) TransformInput(fn func(s *SourceSpec) (*SourceSpec, error)) *ConfigSpec {
	c.transformInput = fn
	return c
}

// TransformOutput sets the check of a transform's output of this type.
func (c *ConfigSpec) TransformOutput(fn func(in *SourceSpec, out *SinkSpec) (string, error)) *ConfigSpec {
	c.transformOutput = fn
	return c
}

// registerNATSSchemes adds the nats and jetstream schemes and the
// transform checks of the nats source and sink (from registerBuiltins).
func registerNATSSchemes() {
	for _, s := range []Scheme{
		{Name: "nats", Usage: "nats:SUBJECT", Input: natsInput, Prepare: prepareNATSInput},
		{Name: "jetstream", Usage: "jetstream:STREAM[:FILTER]", Input: jetstreamInput, Prepare: prepareJetStreamInput},
		{Name: "nats", Usage: "nats:SUBJECT", Output: natsOutput, Prepare: prepareNATSOutput},
	} {
		if err := RegisterScheme(s); err != nil {
			panic(err)
		}
	}
	p, _ := LookupSource("nats")
	p.Spec.TransformInput(natsTransformInput)
	q, _ := LookupSink("nats")
	q.Spec.TransformOutput(natsTransformOutput)
}

func natsInput(arg string, env SchemeEnv) (*SourceSpec, error) {
	if arg == "" {
		return nil, fmt.Errorf("--input nats:SUBJECT: no subject")
	}
	if err := CheckSubject(arg, true); err != nil {
		return nil, fmt.Errorf("--input: %v", err)
	}
	if err := checkStartFlag(env.Start); err != nil {
		return nil, err
	}
	return &SourceSpec{Type: "nats", Subject: arg, Start: env.Start}, nil
}

func jetstreamInput(arg string, env SchemeEnv) (*SourceSpec, error) {
	stream, filter, _ := strings.Cut(arg, ":")
	if stream == "" || strings.ContainsAny(stream, " \t.*>") {
		return nil, fmt.Errorf("--input jetstream:STREAM[:FILTER]: %q is not a stream name (no spaces, '.', '*' or '>')", stream)
	}
	if filter != "" {
		if err := CheckSubject(filter, true); err != nil {
			return nil, fmt.Errorf("--input: %v", err)
		}
	}
	if err := checkStartFlag(env.Start); err != nil {
		return nil, err
	}
	return &SourceSpec{Type: "nats", Stream: stream, Subject: filter, Start: env.Start}, nil
}

func checkStartFlag(start string) error {
	if _, err := ParseNATSStart(start); err != nil {
		return fmt.Errorf("--start %v", err)
	}
	return nil
}

func natsOutput(arg string, _ SchemeEnv) (*SinkSpec, error) {
	if arg == "" {
		return nil, fmt.Errorf("--output %q: want nats:SUBJECT", "nats:")
	}
	if err := CheckSubject(arg, false); err != nil {
		return nil, fmt.Errorf("--output: %v", err)
	}
	return &SinkSpec{Type: "nats", Subject: arg}, nil
}

// prepareNATSInput finds the stream that captures the input subject, or
// creates one.
func prepareNATSInput(ctx context.Context, env DeployEnv, create bool) (string, error) {
	js, err := jetstream.New(env.NATS)
	if err != nil {
		return "", err
	}
	use, err := InputStream(ctx, js, env.Input.Subject, !create)
	if err != nil {
		return "", err
	}
	env.Input.Stream = use.Stream
	if !create {
		return "", nil
	}
	return fmt.Sprintf("input %s: stream %s%s", env.Input.Subject, use.Stream, createdNote(use.Created, "")), nil
}

func prepareJetStreamInput(ctx context.Context, env DeployEnv, create bool) (string, error) {
	if create {
		note := "input: stream " + env.Input.Stream
		if env.Input.Subject != "" {
			note += " (filter " + env.Input.Subject + ")"
		}
		return note, nil
	}
	js, err := jetstream.New(env.NATS)
	if err != nil {
		return "", err
	}
	if _, err := js.Stream(ctx, env.Input.Stream); err != nil {
		return "", fmt.Errorf("--input jetstream:%s: %w", env.Input.Stream, err)
	}
	return "", nil
}

func prepareNATSOutput(ctx context.Context, env DeployEnv, create bool) (string, error) {
	js, err := jetstream.New(env.NATS)
	if err != nil {
		return "", err
	}
	subj := env.Output.Subject
	use, err := OutputStream(ctx, js, subj, "", !create)
	if err != nil {
		return "", err
	}
	if in := env.Input; in != nil && in.Type == "nats" && use.Stream == in.Stream && in.Subject == "" {
		return "", flagErrorf("--output", "nats:%s goes to stream %s, which the input reads whole: the transform would read its own output", subj, use.Stream)
	}
	if !create {
		return "", nil
	}
	return fmt.Sprintf("output %s: stream %s%s", subj, use.Stream,
		createdNote(use.Created, ", atomic publish, commit markers on "+DefaultCommitSubject(subj)+".>")), nil
}

func createdNote(created bool, what string) string {
	if !created {
		return ""
	}
	return " (created" + what + ")"
}

func natsTransformInput(s *SourceSpec) (*SourceSpec, error) {
	if s.Stream == "" || s.Bounded {
		return nil, fmt.Errorf("a transform's input is an unbounded nats source with a stream, got %+v", s)
	}
	if s.Subject != "" {
		if err := CheckSubject(s.Subject, true); err != nil {
			return nil, flagErrorf("--input", "%v", err)
		}
	}
	st, err := ParseNATSStart(s.Start)
	if err != nil {
		return nil, flagErrorf("--start", "%v", err)
	}
	c := *s
	c.Start = st.String()
	return &c, nil
}

func natsTransformOutput(in *SourceSpec, o *SinkSpec) (string, error) {
	if err := CheckSubject(o.Subject, false); err != nil {
		return "", flagErrorf("--output", "%v", err)
	}
	if in != nil && in.Type == "nats" {
		if err := CheckTransformOutput(in.Subject, o.Subject); err != nil {
			return "", flagErrorf("--output", "%v", err)
		}
	}
	return "nats:" + o.Subject, nil
}

// CheckTransformOutput refuses a transform's output subject that its input
// filter (wildcards allowed; "" reads the whole stream and is not checked
// here) also matches: the transform would read its own output.
func CheckTransformOutput(input, output string) error {
	if input != "" && server.SubjectsCollide(input, output) {
		return fmt.Errorf("nats:%s is also read by the input %s: the transform would read its own output", output, input)
	}
	return nil
}
