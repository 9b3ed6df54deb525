// Package connector holds streamd's sources and sinks and the registry
// they plug into, in the shape of Benthos' service.RegisterInput(name,
// spec, ctor). The task runtime drives them: a source subtask calls Read
// in a loop and sends what it returns downstream; a sink subtask calls
// Write for every batch it receives and Close last; a TwoPhaseSink commits
// with two phases so its output is exactly once.
//
// # The registry
//
// Every source and sink type a job file can name is registered with a
// name, a ConfigSpec and a constructor:
//
//	func init() {
//		connector.MustRegisterSource("kafka", connector.NewConfigSpec().
//			Summary("Reads Kafka topics; partitions are the splits.").
//			Field(
//				connector.NewStringListField("brokers").Description("Seed brokers.").Require("a kafka source needs brokers"),
//				connector.NewStringListField("topics").Description("Topics to read.").Example([]string{"orders"}),
//				connector.NewStringField("start").Description("Where a first start begins.").Default("earliest").
//					OneOf("start", "earliest", "latest"),
//			).
//			EventTimestamp().
//			Check(func(c connector.Config) []connector.FieldError { ... }).
//			RescalePositions(spreadPartitions),
//			func(s *connector.SourceSpec, env connector.SourceEnv) (connector.Source, error) {
//				c := s.Conf() // the checked values: c.StringList("topics"), c.String("start"), ...
//				return newKafkaSource(c, env.Subtask, env.Parallelism, env.Position)
//			})
//	}
//
// The job-file loader (internal/jobfile), streamd validate and deploy, dead
// letters, the REST API (GET /connectors) and docs/connectors.md read the
// registry, so a connector is one file and its test; this package knows
// nothing of the loader. The spec's fields give each field's type,
// default, docs, examples, Require and OneOf; the loader checks them (an
// unknown field gets "did you mean", every problem its line), runs Check,
// and puts the values into SourceSpec.Config or SinkSpec.Config (Conf
// reads them). The built-in types (file, generator, nats; file, stdout,
// discard, nats) keep their values in the typed fields of SourceSpec and
// SinkSpec instead, so that job specs, checkpoints and tests of earlier
// versions read the same.
//
// Lifecycle of a source subtask, as the runtime drives it:
//
//  1. The job file is loaded and checked (above).
//  2. Deployed: ConfigSpec.Artifact names a local file the hosts need; it
//     is uploaded, and the host's copy replaces it on the host's spec.
//  3. On every attempt of every subtask the SourceConstructor is called
//     with the subtask's SourceEnv: Position is nil on a first start and
//     the Source.Position() of the same subtask in the checkpoint restored
//     from. A source with RescalePositions restores at another
//     parallelism: the hook spreads the old subtasks' positions (its
//     splits, such as Kafka partitions with their offsets) over the new
//     ones, or tells each new subtask what the old ones produced (the
//     round-robin generator, nexmark, file and nats sources: package
//     roundrobin); without it, a source's parallelism is fixed once a
//     checkpoint holds its positions.
//  4. Read, Watermark and Position are called by one goroutine (Source).
//     Position is taken at every checkpoint barrier and stored as it is:
//     its encoding is the connector's checkpoint format and must keep
//     restoring in later versions.
//  5. Close is always called last, also after a failure.
//
// Lifecycle of a sink subtask:
//
//  1. and 2. As for a source.
//  3. The SinkConstructor is called when the subtask opens. A TwoPhaseSink
//     then gets CommitPending with its states in the checkpoint restored
//     from (commits are idempotent: committing what was committed does
//     nothing), Write for every batch, PreCommit at each checkpoint barrier
//     (its result is the subtask's checkpointed sink state), Commit when a
//     checkpoint completes, and CommitFinal at the end of a job without
//     checkpoints. A sink that is not a TwoPhaseSink is at least once.
//  4. A subtask restored as finished runs no Write: ConfigSpec.RestoreFinished
//     commits what the failed attempt left pending; without it, a
//     TwoPhaseSink with pending states is opened, given CommitPending and
//     closed.
//  5. Close is always called last, also after a failure.
//
// Only a TwoPhaseSink whose spec says DeadLetters may be a wasm operator's
// dead_letter sink. A spec that says UsesNATS gets the runtime's shared
// NATS connection (SourceEnv.NATS). SinkEnv.Job names the job's output
// (its deployed id, else its name) so two jobs writing one place keep
// apart.
//
// A connector that can be the input or output of a transform (streamd
// deploy MODULE.wasm --input SCHEME:ARG --output SCHEME:ARG) also registers
// a Scheme (RegisterScheme) and sets TransformInput or TransformOutput on
// its spec (transform.go has the nats and jetstream schemes).
package connector
