package kafka

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/streamd/streamd/internal/connector"
)

// The kafka source and sink register in the connector registry, and the
// kafka:TOPIC scheme of `streamd deploy MODULE.wasm --input/--output`.
// Importing the package (internal/connector/all does) is all the wiring.
func init() {
	connector.MustRegisterSource("kafka", connector.NewConfigSpec().
		Summary("Reads Kafka topics (franz-go): partitions are the splits, their offsets the position in a checkpoint.").
		Description("Each partition belongs to one subtask (SubtaskFor); a restore at another parallelism redistributes the offsets. "+
			"Offsets are committed to the consumer group when a checkpoint completes, for monitoring only: a restore reads the checkpoint. "+
			"Record key, value, timestamp and headers go into the record (a guest reads the headers when its SDK exports streamd_record_headers, as both SDKs do); "+
			"event time is the record timestamp, with a watermark per partition and idleness. New partitions are found while running. "+
			"The source's lag (records behind the high watermark) is in streamd_source_lag.").
		Field(append(clientFields(),
			connector.NewStringListField("topics").Description("The topics to read (or topic_regex).").Example([]string{"orders"}),
			connector.NewStringField("topic_regex").Description("A Go regular expression matched against whole topic names (or topics)."),
			connector.NewStringField("group").Description("The consumer group offsets are committed to when a checkpoint completes (monitoring), and start: group starts from."),
			connector.NewStringField("start").Description("Where a source without a checkpoint starts.").Default(StartEarliest).
				OneOf("start position", StartEarliest, StartLatest, StartTimestamp, StartGroup),
			connector.NewStringField("start_timestamp").Description("With start: timestamp, an RFC 3339 time."),
			connector.NewStringField("isolation").Description("read_committed reads only committed transactions' records.").Default(ReadCommitted).
				OneOf("isolation level", ReadCommitted, ReadUncommitted),
			connector.NewDurationField("partition_idle_timeout").Description("A partition without records for this long stops holding the watermark back; 0: never.").Default(time.Duration(0)),
			connector.NewDurationField("discovery_interval").Description("How often new partitions (and topics of topic_regex) are looked for, and the lag refreshed.").Default(10*time.Second),
		)...).
		Example("source: {type: kafka, brokers: [localhost:9092], topics: [orders], group: streamd-orders}").
		Check(func(c connector.Config) []connector.FieldError {
			cfg, err := sourceConfigOf(c, 0)
			if err == nil {
				err = cfg.Validate()
			}
			return fieldErrors(err)
		}).
		DescribeSource(func(s *connector.SourceSpec) string {
			c := s.Conf()
			what := strings.Join(c.StringList("topics"), ",")
			if what == "" {
				what = "/" + c.String("topic_regex") + "/"
			}
			return "source kafka " + what + " at " + strings.Join(c.StringList("brokers"), ",")
		}).
		RescalePositions(RedistributePositions).
		TransformInput(func(s *connector.SourceSpec) (*connector.SourceSpec, error) { return s, nil }),
		func(s *connector.SourceSpec, env connector.SourceEnv) (connector.Source, error) {
			cfg, err := sourceConfigOf(s.Conf(), s.WatermarkLag)
			if err != nil {
				return nil, err
			}
			return NewSource(env.Context, cfg, env.Subtask, env.Parallelism, env.Position)
		})
	connector.MustRegisterSink("kafka", connector.NewConfigSpec().
		Summary("Writes to a Kafka topic: exactly once (a transaction per checkpoint, committed when it completes) or at least once.").
		Description("Exactly once: a checkpoint's records are staged in its state and produced, once it completes, in one Kafka "+
			"transaction that also commits a marker (the offset metadata of a marker group) naming the checkpoint, so a restore "+
			"knows what is already in Kafka; transactional ids are per subtask and fence a zombie attempt. Readers must read "+
			"read_committed. Key and partition come from the record's key; its headers become the Kafka record's. The topic must exist.").
		Field(append(clientFields(),
			connector.NewStringField("topic").Description("The topic to write.").Require("a kafka sink writes to topic").Example("orders.upper"),
			connector.NewStringField("delivery").Description("exactly_once (transactions) or at_least_once (idempotent produce, flushed at each checkpoint).").
				Default(ExactlyOnce).OneOf("delivery guarantee", ExactlyOnce, AtLeastOnce),
			connector.NewStringField("transactional_id_prefix").Description("Prefixes the transactional ids and marker groups.").Default("streamd"),
			connector.NewDurationField("transaction_timeout").Description("Bounds a transaction on the broker (at most its transaction.max.timeout.ms). With checkpoints more often than an eighth of it, the exactly-once sink produces records as they come, into the transaction that commits them when their checkpoint completes; otherwise it produces a checkpoint's records once it completes.").Default(60*time.Second),
		)...).
		Example("sink: {type: kafka, brokers: [localhost:9092], topic: orders.upper}").
		Check(func(c connector.Config) []connector.FieldError {
			cfg, err := sinkConfigOf(c, "job", "operator")
			if err == nil {
				err = cfg.Validate()
			}
			return fieldErrors(err)
		}).
		DescribeSink(func(s *connector.SinkSpec) string {
			c := s.Conf()
			return fmt.Sprintf("sink kafka %s at %s (%s)", c.String("topic"), strings.Join(c.StringList("brokers"), ","), c.String("delivery"))
		}).
		TransformOutput(func(in *connector.SourceSpec, o *connector.SinkSpec) (string, error) {
			topic := o.Conf().String("topic")
			if in != nil && in.Type == "kafka" && slices.Contains(in.Conf().StringList("topics"), topic) {
				return "", &connector.FlagError{Flag: "--output", Message: fmt.Sprintf("kafka:%s is also the input: the transform would read its own output", topic)}
			}
			return "kafka:" + topic, nil
		}),
		func(s *connector.SinkSpec, env connector.SinkEnv) (connector.Sink, error) {
			cfg, err := sinkConfigOf(s.Conf(), env.Job, env.Operator)
			if err != nil {
				return nil, err
			}
			cfg.CheckpointInterval = env.CheckpointInterval
			return NewAnySink(env.Context, cfg, env.Subtask, env.Parallelism)
		})
	if err := connector.RegisterSetting(connector.Setting{Key: SettingBrokers, Flag: "kafka-brokers",
		Usage: "the Kafka cluster (host:port,...) of kafka:TOPIC transform inputs and outputs"}); err != nil {
		panic(err)
	}
	for _, s := range []connector.Scheme{
		{Name: "kafka", Usage: "kafka:TOPIC", Input: schemeInput},
		{Name: "kafka", Usage: "kafka:TOPIC", Output: schemeOutput},
	} {
		if err := connector.RegisterScheme(s); err != nil {
			panic(err)
		}
	}
}

// clientFields are the fields of the source and the sink that reach the
// cluster.
func clientFields() []*connector.Field {
	return []*connector.Field{
		connector.NewStringListField("brokers").Description("Seed brokers, host:port.").Require("name the Kafka cluster's brokers").Example([]string{"localhost:9092"}),
		connector.NewStringField("client_id").Description("The client's name in the brokers' logs.").Default("streamd"),
		connector.NewObjectField("sasl",
			connector.NewStringField("mechanism").Description("PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."),
			connector.NewStringField("user").Description("The SASL user."),
			connector.NewStringField("password").Description("The SASL password."),
		).Description("SASL authentication."),
		connector.NewObjectField("tls",
			connector.NewBoolField("enabled").Description("Use TLS (also on when a file is given)."),
			connector.NewPathField("ca_file").Description("PEM bundle of the CAs to trust (default: the system's)."),
			connector.NewPathField("cert_file").Description("Client certificate (with key_file)."),
			connector.NewPathField("key_file").Description("Client key (with cert_file)."),
			connector.NewBoolField("insecure_skip_verify").Description("Do not verify the brokers' certificates (tests only)."),
		).Description("TLS to the brokers."),
	}
}

func clientConfig(c connector.Config) ClientConfig {
	sasl, tls := c.Object("sasl"), c.Object("tls")
	return ClientConfig{Brokers: c.StringList("brokers"), ClientID: c.String("client_id"),
		SASLMechanism: sasl.String("mechanism"), SASLUser: sasl.String("user"), SASLPassword: sasl.String("password"),
		TLS: tls.Bool("enabled"), TLSCAFile: tls.String("ca_file"), TLSCertFile: tls.String("cert_file"), TLSKeyFile: tls.String("key_file"),
		InsecureSkipVerify: tls.Bool("insecure_skip_verify")}
}

func sourceConfigOf(c connector.Config, lag time.Duration) (SourceConfig, error) {
	cfg := SourceConfig{Client: clientConfig(c), Topics: c.StringList("topics"), TopicRegex: c.String("topic_regex"), Group: c.String("group"),
		Start: c.String("start"), Isolation: c.String("isolation"), WatermarkLag: lag,
		PartitionIdleTimeout: c.Duration("partition_idle_timeout"), DiscoveryInterval: c.Duration("discovery_interval")}
	if ts := c.String("start_timestamp"); ts != "" {
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return cfg, fmt.Errorf("start_timestamp: %q is not an RFC 3339 time", ts)
		}
		cfg.StartTimestamp = t
	}
	return cfg, nil
}

func sinkConfigOf(c connector.Config, job, operator string) (SinkConfig, error) {
	return SinkConfig{Client: clientConfig(c), Topic: c.String("topic"), Delivery: c.String("delivery"), Job: job, Operator: operator,
		TransactionalIDPrefix: c.String("transactional_id_prefix"), TransactionTimeout: c.Duration("transaction_timeout")}, nil
}

// fieldErrors splits Validate's joined errors ("field: message" each).
func fieldErrors(err error) []connector.FieldError {
	if err == nil {
		return nil
	}
	var out []connector.FieldError
	for _, line := range strings.Split(err.Error(), "\n") {
		field, msg, ok := strings.Cut(line, ": ")
		if !ok || strings.ContainsAny(field, " ") {
			field, msg = "", line
		}
		out = append(out, connector.Errorf(field, "%s", msg))
	}
	return out
}

// SettingBrokers is the configuration key (flag --kafka-brokers,
// STREAMD_KAFKA_BROKERS) of the Kafka cluster of deploy's kafka:TOPIC
// inputs and outputs: host:port,... (a job file's kafka source or sink
// names its brokers).
const SettingBrokers = "kafka.brokers"

// brokersFor is the brokers of settings (SettingBrokers) as Config values.
func brokersFor(flag string, settings map[string]string) ([]any, error) {
	var out []any
	for _, b := range strings.Split(settings[SettingBrokers], ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, &connector.FlagError{Flag: flag, Message: "kafka:TOPIC needs the cluster's brokers: --kafka-brokers host:port,... (kafka.brokers, STREAMD_KAFKA_BROKERS)"}
	}
	return out, nil
}

// schemeInput is --input kafka:TOPIC, from --start (first: earliest, new:
// latest, time:RFC3339: that timestamp).
func schemeInput(arg string, env connector.SchemeEnv) (*connector.SourceSpec, error) {
	start := env.Start
	if err := validTopic(arg); err != nil {
		return nil, fmt.Errorf("--input kafka:TOPIC: %w", err)
	}
	brokers, err := brokersFor("--input", env.Settings)
	if err != nil {
		return nil, err
	}
	c := connector.Config{"brokers": brokers, "topics": []any{arg}}
	switch {
	case start == "" || start == "first":
		c["start"] = StartEarliest
	case start == "new":
		c["start"] = StartLatest
	case strings.HasPrefix(start, "time:"):
		c["start"], c["start_timestamp"] = StartTimestamp, strings.TrimPrefix(start, "time:")
	default:
		return nil, errors.New("--start " + start + ": a kafka input starts at first, new or time:RFC3339")
	}
	return &connector.SourceSpec{Type: "kafka", Config: &c}, nil
}

// schemeOutput is --output kafka:TOPIC (exactly once).
func schemeOutput(arg string, env connector.SchemeEnv) (*connector.SinkSpec, error) {
	if err := validTopic(arg); err != nil {
		return nil, fmt.Errorf("--output kafka:TOPIC: %w", err)
	}
	brokers, err := brokersFor("--output", env.Settings)
	if err != nil {
		return nil, err
	}
	c := connector.Config{"brokers": brokers, "topic": arg}
	return &connector.SinkSpec{Type: "kafka", Config: &c}, nil
}
