package connector

import "time"

// SourceSpec is a source of a job (Vertex.Spec of a vertex without
// inputs): its registered Type, the event-time settings every source has
// and its values. A type registered with the registry keeps its values in
// Config; the typed fields below are those of the built-in types (file,
// generator, nats), kept as they were so that job specs and tests of
// earlier versions read the same. Do not add fields for a new type: give
// it a ConfigSpec.
type SourceSpec struct {
	Type string // a registered source type: "generator", "file", "nats", ...

	// Config holds the values of a type that is not built in, by field
	// name (see ConfigSpec); nil for the built-in types. (A pointer keeps
	// SourceSpec comparable.) Conf reads it.
	Config *Config `json:",omitempty"`

	// file: one record per line (value = line without the newline, no key, no timestamp).
	Path string // absolute (resolved against the job file's directory)

	// generator: deterministic records. Record n (0-based, counted over the whole
	// operator; subtask i of p produces n = i, i+p, i+2p, ...) has
	//   key   = KeyPattern with "{n}" replaced by n and "{k}" by n % Keys  ("" -> no key)
	//   value = ValuePattern with the same replacements, padded with '.' to ValueSize bytes if ValueSize > len
	//   timestamp = StartTS + n*TSStep
	Count        int64   // bounded: total records over all subtasks; 0 with Rate > 0 -> unbounded
	Rate         float64 // records per second over all subtasks; 0 = as fast as possible
	KeyPattern   string  // default "key-{k}"
	ValuePattern string  // default "value-{n}"
	Keys         int64   // default 100
	ValueSize    int     // default 0 (no padding)
	StartTS      int64   // default 0
	TSStep       int64   // ms; default 1
	// WatermarkLag is watermark.max_out_of_orderness (alias
	// watermark_lag), every source type: watermark = max timestamp seen -
	// lag; default 0.
	WatermarkLag time.Duration

	// Event time and watermarks of every source type (SPEC14 §3).
	// TimestampField (timestamp.field; file and nats): the event time is
	// this JSON field of the value, a number (ms since the epoch) or an
	// RFC 3339 string; "": the record's own timestamp (generator: its
	// pattern, nats: the Streamd-Timestamp header or the stream time, file:
	// none).
	TimestampField string `json:",omitempty"`
	// IdleTimeout (watermark.idle_timeout): a source subtask that read no
	// record for this long is idle (it no longer holds back downstream
	// watermarks) until its next record; 0: never idle.
	IdleTimeout time.Duration `json:",omitempty"`
	// WatermarkInterval (watermark.interval): the least time between two
	// watermarks a source subtask sends; 0: DefaultWatermarkInterval.
	WatermarkInterval time.Duration `json:",omitempty"`

	// nats: a JetStream stream (connector.NATSSource). Subtask i of p reads
	// the messages whose stream sequence is i modulo p.
	URL     string // NATS server URL(s), comma-separated; "" = the runtime's default (config nats.url)
	Stream  string // the stream to read; required
	Subject string // filter subject (wildcards allowed); "" = every message of the stream
	Bounded bool   // read up to the stream's last message at the first start, then end
	KeyFrom string // "header" (default: the Streamd-Key header) | "subject" (its last token)
	// Start is where the source starts at its first start, as
	// ParseNATSStart reads it ("" = first); a restore resumes from the
	// checkpointed position.
	Start string `json:",omitempty"`
}

// DefaultWatermarkInterval is watermark.interval when a source sets none.
const DefaultWatermarkInterval = 200 * time.Millisecond

// Interval is the source's watermark interval, the default if unset.
func (s *SourceSpec) Interval() time.Duration {
	if s.WatermarkInterval > 0 {
		return s.WatermarkInterval
	}
	return DefaultWatermarkInterval
}

// SinkSpec is a sink of a job (Vertex.Spec of a vertex of type sink), as
// SourceSpec: Config for a registered type, the typed fields for the
// built-in ones (file, stdout, discard, nats).
type SinkSpec struct {
	Type string // a registered sink type: "file", "stdout", "discard", "nats", ...

	// Config: see SourceSpec.Config.
	Config *Config `json:",omitempty"`
	// file: a directory (absolute); subtask i writes part-<i> files into it, one line per record:
	// the value, or "key<TAB>value" when Format is "kv".
	Path   string
	Format string // "value" (default) | "kv"
	// Job is the id of the deployed job the sink belongs to: the
	// controller sets it (it is not in job files) and it goes into every
	// file name (part-<job>-<i>-<id>) of a file sink and the writer name of
	// a nats sink, so jobs sharing a directory or a subject keep every
	// record. "" for streamd run.
	Job string `json:",omitempty"`

	// nats: publishes to Subject (connector.NATSSink), which a stream
	// allowing atomic publish must capture; with checkpointing each
	// checkpoint's records are published when it completes, in atomic
	// batches with commit markers on CommitSubject.<writer>.<subtask>
	// (exactly once).
	URL           string // NATS server URL(s), comma-separated; "" = the runtime's default (config nats.url)
	Subject       string // required; no wildcards
	CommitSubject string // prefix of the commit-marker subjects; "" = Subject + ".streamd-commit"
}

// Conf is s.Config, nil (no values) when unset.
func (s *SourceSpec) Conf() Config {
	if s.Config == nil {
		return nil
	}
	return *s.Config
}

// Conf is s.Config, nil (no values) when unset.
func (s *SinkSpec) Conf() Config {
	if s.Config == nil {
		return nil
	}
	return *s.Config
}
