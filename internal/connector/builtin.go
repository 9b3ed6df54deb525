package connector

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/roundrobin"
)

// The built-in connectors register as any other, but in a package-level
// variable, which Go initializes before every init function: they come
// first in listings and messages, in this order, whatever other files
// register.
var _ = registerBuiltins()

func registerBuiltins() bool {
	MustRegisterSource("file", fileSourceSpec(), newFileSource)
	MustRegisterSource("generator", generatorSpec(), func(s *SourceSpec, env SourceEnv) (Source, error) {
		return NewGenerator(s, env.Subtask, env.Parallelism, env.Position)
	})
	MustRegisterSource("nats", natsSourceSpec(), newNATSSourceEnv)
	MustRegisterSink("file", fileSinkSpec(), func(s *SinkSpec, env SinkEnv) (Sink, error) {
		return NewFileSink(s.Path, s.Job, env.Subtask, s.Format)
	})
	MustRegisterSink("stdout", NewConfigSpec().
		Summary("Writes every record to standard output, one line each.").
		Field(formatField()).
		bindSinkFields(func(c Config, s *SinkSpec) { s.Format = c.String("format") }).
		DescribeSink(describeFileSink),
		func(s *SinkSpec, env SinkEnv) (Sink, error) { return NewStdoutSink(env.Stdout, env.StdoutMu), nil })
	MustRegisterSink("discard", NewConfigSpec().
		Summary("Drops every record (benchmarks, jobs run for their side effects).").
		bindSinkFields(func(Config, *SinkSpec) {}).
		DescribeSink(describeFileSink),
		func(*SinkSpec, SinkEnv) (Sink, error) { return DiscardSink{}, nil })
	MustRegisterSink("nats", natsSinkSpec(), newNATSSinkEnv)
	registerNATSSchemes()
	return true
}

// legacySourceDefaults are the values every built-in source spec starts
// from (the job-file loader has always set them, whatever the type).
func legacySourceDefaults(s *SourceSpec) {
	s.KeyPattern, s.ValuePattern, s.Keys, s.TSStep = "key-{k}", "value-{n}", 100, 1
}

func fileSourceSpec() *ConfigSpec {
	return NewConfigSpec().
		Summary("Reads a text file, one record per line (the value; no key, no timestamp).").
		Description("With parallelism p every subtask reads the whole file and subtask i keeps the lines whose index is i modulo p. "+
			"`-` reads standard input (one subtask). A named pipe or a character device is read as a stream. "+
			"The position in a checkpoint is the byte offset and index of the next line. It restores at another parallelism: "+
			"new subtask j of p' keeps the lines i ≡ j (mod p') that no old subtask produced, so every line comes exactly once "+
			"(not standard input, which is read once).").
		Field(NewPathField("path").Description(`The file to read, relative to the job file; "-" for standard input.`).
			Example("input.txt").Require(`a file source reads the file at path ("-" for standard input)`)).
		Example("source: {type: file, path: events.jsonl, timestamp: {field: ts}, watermark: {max_out_of_orderness: 2s}}").
		EventTimestamp().
		Check(func(c Config) []FieldError {
			if p := c.String("path"); p != "" && p != "-" {
				if err := CheckInputFile(p); err != nil {
					return []FieldError{{Field: "path", Message: err.Error()}}
				}
			}
			return nil
		}).
		bindSourceFields(func(c Config, s *SourceSpec) { s.Path = c.String("path") }).
		DescribeSource(func(s *SourceSpec) string {
			if s.Path == "-" {
				return "source stdin"
			}
			return "source file " + s.Path
		}).
		RescalePositions(rescaleFilePositions).
		Artifact(func(s *SourceSpec) (string, error) {
			if s.Path == "-" {
				return "", fmt.Errorf("a deployed job cannot read standard input; use a file or generator source")
			}
			// The input is uploaded whole: a stream (a FIFO, a device
			// such as /dev/zero) would never end.
			if fi, err := os.Stat(s.Path); err == nil && !fi.Mode().IsRegular() {
				return "", fmt.Errorf("input file %s is not a regular file (%s): a deployed job's input is uploaded to the hosts, so it must be a file, not a stream", s.Path, fi.Mode().Type())
			}
			return s.Path, nil
		}, func(s *SourceSpec, local string) { s.Path = local })
}

func newFileSource(s *SourceSpec, env SourceEnv) (Source, error) {
	fs, err := NewFileSource(s.Path, env.Stdin, env.Subtask, env.Parallelism, env.Position, env.MaxRecordBytes)
	if err == nil && s.TimestampField != "" {
		fs.SetEventTime(s.TimestampField, s.WatermarkLag)
	}
	return fs, err
}

// CheckInputFile checks a file source's path: a regular file must be
// readable; a FIFO or a character device (a named pipe, /dev/stdin) is a
// stream the source may read, so it is accepted without being opened
// (opening a FIFO blocks until a writer comes). A directory, a socket or a
// block device is refused.
func CheckInputFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cannot read input file %s: %v", path, unwrapPathError(err))
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("cannot read input file %s: %v", path, unwrapPathError(err))
		}
		f.Close()
	case m&fs.ModeNamedPipe != 0, m&fs.ModeCharDevice != 0:
	case m.IsDir():
		return fmt.Errorf("input file %s is a directory", path)
	default:
		return fmt.Errorf("input file %s is a %s, not a file, a named pipe or a character device", path, fileKind(m))
	}
	return nil
}

// fileKind names the type of a file that is neither regular nor a directory.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeIrregular != 0:
		return "irregular file"
	}
	return "special file"
}

func unwrapPathError(err error) error {
	if pe, ok := err.(*fs.PathError); ok {
		return pe.Err
	}
	return err
}

func generatorSpec() *ConfigSpec {
	return NewConfigSpec().
		Summary("Deterministic records: record n has key, value and timestamp computed from n.").
		Description("Subtask i of p produces records n = i, i+p, i+2p, ...; `{n}` in a pattern is n and `{k}` is n modulo keys, "+
			"so a run, a rescaled run and a resumed run produce the same records. The timestamp is start_ts + n*ts_step. "+
			"The position in a checkpoint is the next n. It restores at another parallelism: new subtask j of p' produces the "+
			"n ≡ j (mod p') that no old subtask produced, in order, so every record comes exactly once.").
		Field(
			NewIntField("count").Description("Records in total over all subtasks; 0 with a rate: unbounded.").Example(1000000),
			NewFloatField("rate").Description("Records per second over all subtasks; 0: as fast as possible.").Default(0.0),
			NewStringField("key").Description(`The key pattern; "" gives records without a key.`).Default("key-{k}"),
			NewStringField("value").Description("The value pattern.").Default("value-{n}"),
			NewIntField("keys").Description("How many distinct {k}.").Default(int64(100)),
			NewIntField("value_size").Description("Pad values with '.' to this many bytes.").Default(int64(0)),
			NewIntField("start_ts").Description("The timestamp of record 0, in ms.").Default(int64(0)),
			NewMillisField("ts_step").Description("The timestamp step between records (a duration, or ms).").Default(time.Millisecond),
		).
		Example("source: {type: generator, count: 1000000, rate: 50000, key: \"user-{k}\", keys: 1000}").
		Check(func(c Config) []FieldError {
			var errs []FieldError
			if n := c.Int("count"); n < 0 {
				errs = append(errs, Errorf("count", "must not be negative, got %d", n))
			}
			if r := c.Float("rate"); r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
				errs = append(errs, Errorf("rate", "must be a non-negative number of records per second, got %v", r))
			}
			if c.Int("count") == 0 && c.Float("rate") == 0 {
				errs = append(errs, Errorf("count", "a generator needs count (records in total) or rate (records per second; unbounded without count)"))
			}
			if k := c.Int("keys"); k < 1 {
				errs = append(errs, Errorf("keys", "must be at least 1, got %d", k))
			}
			if n := c.Int("value_size"); n < 0 || n > math.MaxInt32 {
				errs = append(errs, Errorf("value_size", "must not be negative, got %d", n))
			}
			if d := c.Duration("ts_step"); d%time.Millisecond != 0 {
				errs = append(errs, Errorf("ts_step", "timestamps are in milliseconds: %v is not a whole number of them", d))
			}
			return errs
		}).
		bindSourceFields(func(c Config, s *SourceSpec) {
			s.Count, s.Rate, s.KeyPattern, s.ValuePattern = c.Int("count"), c.Float("rate"), c.String("key"), c.String("value")
			s.Keys, s.ValueSize, s.StartTS, s.TSStep = c.Int("keys"), int(c.Int("value_size")), c.Int("start_ts"), c.Duration("ts_step").Milliseconds()
		}).
		DescribeSource(func(s *SourceSpec) string {
			d := fmt.Sprintf("source generator count=%d", s.Count)
			if s.Rate > 0 {
				d += fmt.Sprintf(" rate=%g/s", s.Rate)
			}
			return d
		}).
		RescalePositions(roundrobin.Rescale)
}

func natsURLField() *Field {
	return NewStringField("url").Description("NATS server URL(s), comma-separated; left out: the configured nats.url.").
		Example("nats://127.0.0.1:4222")
}

// checkNATSURL checks a url field given.
func checkNATSURL(c Config) []FieldError {
	if !c.Has("url") {
		return nil
	}
	u := c.String("url")
	if u == "" {
		return []FieldError{Errorf("url", "empty: leave url out to use the configured nats.url")}
	}
	if err := natsutil.URLs(u)(&natsutil.ConnectOptions{}); err != nil {
		return []FieldError{Errorf("url", "%s", strings.TrimPrefix(err.Error(), "natsutil: "))}
	}
	return nil
}

func natsSourceSpec() *ConfigSpec {
	return NewConfigSpec().
		Summary("Reads a NATS JetStream stream (subtask i of p: the messages whose stream sequence is i modulo p).").
		Description("The value is the payload; the key is the Streamd-Key header (or the subject's last token); the timestamp "+
			"the Streamd-Timestamp header, else the stream time; the message's other headers, but Streamd-* and Nats-*, are the record's headers (by name). With parallelism p every subtask reads the whole stream and subtask i keeps "+
			"the messages whose stream sequence is i modulo p. The position in a checkpoint is the next stream sequence. It restores at "+
			"another parallelism: new subtask j of p' keeps the sequences ≡ j (mod p') that no old subtask kept, each message exactly once "+
			"(a bounded source then reads up to the largest of its old subtasks' bounds).").
		Field(
			natsURLField(),
			NewStringField("stream").Description("The JetStream stream to read.").Example("ORDERS").
				Require("a nats source reads the JetStream stream named by stream"),
			NewStringField("subject").Description("A filter subject (wildcards allowed); left out: every message of the stream.").Example("orders.>"),
			NewBoolField("bounded").Description("Read up to the stream's last message at the first start, then end.").Default(false),
			NewStringField("key_from").Description("Where the key comes from: header (the Streamd-Key header; left out) or subject (its last token)."),
			NewStringField("start").Description("Where a first start begins: first (left out), new, seq:N or time:RFC3339; a restore resumes from the checkpoint.").Example("seq:42"),
		).
		Example("source: {type: nats, stream: ORDERS, subject: \"orders.eu.>\", start: new}").
		EventTimestamp().
		UsesNATS().
		Check(func(c Config) []FieldError {
			errs := checkNATSURL(c)
			if st := c.String("stream"); c.Has("stream") && st == "" {
				errs = append(errs, Errorf("stream", "empty: name the JetStream stream to read"))
			} else if strings.ContainsAny(st, " \t.*>") {
				errs = append(errs, Errorf("stream", "%q is not a stream name (no spaces, '.', '*' or '>')", st))
			}
			if s := c.String("subject"); s != "" {
				if err := CheckSubject(s, true); err != nil {
					errs = append(errs, Errorf("subject", "%v", err))
				}
			}
			if k := c.String("key_from"); k != KeyFromHeader && k != KeyFromSubject && k != "" {
				errs = append(errs, Errorf("key_from", "unknown key source %q (want header or subject)", k))
			}
			if st := c.String("start"); c.Has("start") && st == "" {
				errs = append(errs, Errorf("start", "empty: want first, new, seq:N or time:RFC3339 (leave start out for first)"))
			} else if _, err := ParseNATSStart(st); err != nil {
				errs = append(errs, Errorf("start", "%v", err))
			}
			return errs
		}).
		bindSourceFields(func(c Config, s *SourceSpec) {
			s.URL, s.Stream, s.Subject, s.Bounded = c.String("url"), c.String("stream"), c.String("subject"), c.Bool("bounded")
			if st, err := ParseNATSStart(c.String("start")); err == nil && c.Has("start") {
				s.Start = st.String()
			}
			s.KeyFrom = c.String("key_from")
		}).
		DescribeSource(func(s *SourceSpec) string {
			d := "source nats stream " + s.Stream
			if s.Subject != "" {
				d += " subject " + s.Subject
			}
			if s.Bounded {
				d += " bounded"
			}
			if s.URL != "" {
				d += " at " + s.URL
			}
			return d
		}).
		RescalePositions(rescaleNATSPositions)
}

// natsSetupTimeout bounds connecting a nats source or sink subtask.
const natsSetupTimeout = 30 * time.Second

func newNATSSourceEnv(s *SourceSpec, env SourceEnv) (Source, error) {
	if env.NATS == nil {
		return nil, fmt.Errorf("nats source: the runtime has no NATS connection")
	}
	nc, err := env.NATS(s.URL)
	if err != nil {
		return nil, fmt.Errorf("nats source: %w", err)
	}
	start, err := ParseNATSStart(s.Start)
	if err != nil {
		return nil, fmt.Errorf("nats source: start %w", err)
	}
	ctx, cancel := context.WithTimeout(env.Context, natsSetupTimeout)
	defer cancel()
	return NewNATSSourceConn(ctx, nc, NATSSourceOptions{
		Stream: s.Stream, Subject: s.Subject, Bounded: s.Bounded,
		KeyFrom: s.KeyFrom, WatermarkLag: s.WatermarkLag, TimestampField: s.TimestampField, Start: start,
	}, env.Subtask, env.Parallelism, env.Position)
}

func formatField() *Field {
	return NewStringField("format").Description("value: a line is the value; kv: key, a tab, then the value.").
		Default("value").OneOf("format", "value", "kv")
}

func describeFileSink(s *SinkSpec) string {
	d := "sink " + s.Type
	if s.Path != "" {
		d += " " + s.Path + string(filepath.Separator)
	}
	if s.Format == "kv" {
		d += " format=kv"
	}
	return d
}

func fileSinkSpec() *ConfigSpec {
	return NewConfigSpec().
		Summary("Writes part files into a directory, exactly once (two-phase commit: a checkpoint's files become visible when it completes).").
		Description("Subtask i writes `part-<i>-<checkpoint>` files (with the job id when deployed), one line per record. "+
			"Files in progress and pending are hidden (dot files) until their checkpoint completes.").
		Field(
			NewPathField("path").Description("The directory, relative to the job file.").Example("out/").
				Require("a file sink writes part files into the directory at path"),
			formatField(),
		).
		Example("sink: {type: file, path: out/, format: kv}").
		DeadLetters().
		Check(func(c Config) []FieldError {
			if p := c.String("path"); p != "" {
				if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
					return []FieldError{Errorf("path", "%s is a file; a file sink writes into a directory", p)}
				}
			}
			return nil
		}).
		bindSinkFields(func(c Config, s *SinkSpec) { s.Path, s.Format = c.String("path"), c.String("format") }).
		DescribeSink(describeFileSink).
		RestoreFinished(func(s *SinkSpec, env SinkEnv, r FinishedRestore) error {
			// A fully finished operator keeps no state: subtask 0 commits
			// every pending file of the job that wrote the checkpoint.
			if env.Subtask != 0 {
				return nil
			}
			return CommitPendingUpTo(s.Path, PartPrefix(r.JobID), r.CheckpointID)
		})
}

func natsSinkSpec() *ConfigSpec {
	return NewConfigSpec().
		Summary("Publishes to a NATS subject captured by a JetStream stream, exactly once with checkpointing (atomic batches with commit markers).").
		Description("With checkpointing each checkpoint's records are published when it completes, in atomic batches with a commit marker "+
			"on `<commit_subject>.<writer>.<subtask>`, so a restore knows what is already in the stream; without, at once. "+
			"A record's headers become the message's; a header NATS cannot carry (no name, a colon or space in it, a line break in "+
			"the value) or named Streamd-* or Nats-* fails the write.").
		Field(
			natsURLField(),
			NewStringField("subject").Description("The subject to publish to (no wildcards).").Example("results").
				Require("a nats sink publishes to subject (a JetStream stream must capture it)"),
			NewStringField("commit_subject").Description("Prefix of the commit-marker subjects; left out: subject + \".streamd-commit\".").Example("commits.results"),
		).
		Example("sink: {type: nats, subject: results.upper}").
		UsesNATS().
		DeadLetters().
		Check(func(c Config) []FieldError {
			errs := checkNATSURL(c)
			if s := c.String("subject"); c.Has("subject") && s == "" {
				errs = append(errs, Errorf("subject", "empty: name the subject to publish to"))
			} else if s != "" {
				if err := CheckSubject(s, false); err != nil {
					errs = append(errs, Errorf("subject", "%v", err))
				}
			}
			if s := c.String("commit_subject"); s != "" {
				if err := CheckSubject(s, false); err != nil {
					errs = append(errs, Errorf("commit_subject", "%v", err))
				}
			}
			return errs
		}).
		bindSinkFields(func(c Config, s *SinkSpec) {
			s.URL, s.Subject, s.CommitSubject = c.String("url"), c.String("subject"), c.String("commit_subject")
		}).
		DescribeSink(func(s *SinkSpec) string {
			d := "sink nats subject " + s.Subject
			if s.URL != "" {
				d += " at " + s.URL
			}
			return d
		}).
		RescalePositions(rescaleNATSPositions)
}

// newNATSSinkEnv opens a nats sink subtask. Its writer (the commit-marker
// subjects) is env.Job and env.Operator; without checkpointing it
// publishes at once (Direct).
func newNATSSinkEnv(s *SinkSpec, env SinkEnv) (Sink, error) {
	if env.NATS == nil {
		return nil, fmt.Errorf("nats sink: the runtime has no NATS connection")
	}
	nc, err := env.NATS(s.URL)
	if err != nil {
		return nil, fmt.Errorf("nats sink: %w", err)
	}
	ctx, cancel := context.WithTimeout(env.Context, natsSetupTimeout)
	defer cancel()
	return NewNATSSinkConn(ctx, nc, NATSSinkOptions{
		Subject: s.Subject, CommitSubject: s.CommitSubject, Job: env.Job, Operator: env.Operator, Direct: !env.Checkpointing,
	}, env.Subtask, env.Parallelism)
}

// CheckSubject checks a NATS subject: dot-separated non-empty tokens
// without spaces; wildcards ('*' tokens, a last '>') only if wildcards
// (a source's filter, not a sink's subject).
func CheckSubject(subj string, wildcards bool) error {
	toks := strings.Split(subj, ".")
	for i, tok := range toks {
		switch {
		case tok == "" || strings.ContainsAny(tok, " \t\r\n"):
			return fmt.Errorf("%q is not a NATS subject (dot-separated tokens without spaces)", subj)
		case tok == "*" || (tok == ">" && i == len(toks)-1):
			if !wildcards {
				return fmt.Errorf("%q has a wildcard; a sink publishes to one subject", subj)
			}
		case strings.ContainsAny(tok, "*>"):
			return fmt.Errorf("%q is not a NATS subject ('*' and '>' are whole tokens, '>' only last)", subj)
		}
	}
	return nil
}
