// Package kafka is streamd's Kafka connector (github.com/twmb/franz-go): a
// source whose splits are the partitions of its topics, with their offsets
// in the checkpoint, and an exactly-once sink that produces a checkpoint's
// records in one Kafka transaction once the checkpoint is complete (Sink,
// see its doc for the argument), or an at-least-once sink without
// transactions (AtLeastOnceSink).
//
// The source implements connector.Source, connector.ReadySource and
// connector.LagSource; the exactly-once sink connector.TwoPhaseSink, the
// at-least-once one connector.Sink. The package owns its configuration
// (ClientConfig, SourceConfig, SinkConfig, each with Validate) and knows
// nothing of the job-file loader, so registering it is all the wiring.
//
// Why franz-go: pure Go, no cgo, the complete transaction API
// (InitProducerID fencing, TxnOffsetCommit) and an in-process broker,
// kfake, that implements it, so the exactly-once tests run without Docker.
package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanisms (ClientConfig.SASLMechanism).
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// ClientConfig says how to reach the Kafka cluster; the source and the sink
// share it.
type ClientConfig struct {
	Brokers []string // host:port seeds; at least one
	// ClientID names the client in the brokers' logs; default "streamd".
	ClientID string

	// SASL: a mechanism (SASLPlain, SASLScramSHA256, SASLScramSHA512) with
	// a user and password; "" for none.
	SASLMechanism string
	SASLUser      string
	SASLPassword  string

	// TLS: on when TLS is set or any of the files is given. CAFile is a PEM
	// bundle of the CAs to trust (default: the system's); CertFile and
	// KeyFile a client certificate (both or neither); InsecureSkipVerify
	// turns verification off (tests only).
	TLS                bool
	TLSCAFile          string
	TLSCertFile        string
	TLSKeyFile         string
	InsecureSkipVerify bool
}

// Validate reports every problem of c at once, each naming its field.
func (c *ClientConfig) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("brokers: at least one host:port is needed"))
	}
	for i, b := range c.Brokers {
		if _, port, ok := strings.Cut(b, ":"); !ok || port == "" || strings.TrimSpace(b) != b {
			errs = append(errs, fmt.Errorf("brokers[%d]: %q is not host:port", i, b))
		}
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case "":
		if c.SASLUser != "" || c.SASLPassword != "" {
			errs = append(errs, errors.New("sasl: a user or password without a mechanism (want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"))
		}
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if c.SASLUser == "" {
			errs = append(errs, fmt.Errorf("sasl: mechanism %s needs a user", c.SASLMechanism))
		}
	default:
		errs = append(errs, fmt.Errorf("sasl: unknown mechanism %q (want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", c.SASLMechanism))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("tls: a client certificate needs both cert_file and key_file"))
	}
	return errors.Join(errs...)
}

func (c *ClientConfig) tlsOn() bool {
	return c.TLS || c.TLSCAFile != "" || c.TLSCertFile != "" || c.InsecureSkipVerify
}

// opts are the franz-go options of c (Validate first).
func (c *ClientConfig) opts() ([]kgo.Opt, error) {
	id := c.ClientID
	if id == "" {
		id = "streamd"
	}
	o := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.ClientID(id)}
	auth := plain.Auth{User: c.SASLUser, Pass: c.SASLPassword}
	sauth := scram.Auth{User: c.SASLUser, Pass: c.SASLPassword}
	switch strings.ToUpper(c.SASLMechanism) {
	case SASLPlain:
		o = append(o, kgo.SASL(auth.AsMechanism()))
	case SASLScramSHA256:
		o = append(o, kgo.SASL(sauth.AsSha256Mechanism()))
	case SASLScramSHA512:
		o = append(o, kgo.SASL(sauth.AsSha512Mechanism()))
	}
	if c.tlsOn() {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.InsecureSkipVerify}
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("tls: ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls: ca_file %s: no PEM certificate in it", c.TLSCAFile)
			}
			cfg.RootCAs = pool
		}
		if c.TLSCertFile != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
			if err != nil {
				return nil, fmt.Errorf("tls: client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		o = append(o, kgo.DialTLSConfig(cfg))
	}
	return o, nil
}

// Start positions of a source without a checkpoint (SourceConfig.Start).
const (
	StartEarliest  = "earliest"  // the first offset still in each partition (default)
	StartLatest    = "latest"    // the end of each partition when the source opens
	StartTimestamp = "timestamp" // the first record at or after StartTimestamp
	StartGroup     = "group"     // the group's committed offsets; earliest without one
)

// Isolation levels (SourceConfig.Isolation).
const (
	ReadCommitted   = "read_committed" // default: only records of committed transactions
	ReadUncommitted = "read_uncommitted"
)

// SourceConfig configures the kafka source.
type SourceConfig struct {
	Client ClientConfig
	// Topics to read, or TopicRegex (a Go regular expression matched
	// against the whole topic name); exactly one of the two.
	Topics     []string
	TopicRegex string
	// Group is the consumer group the source commits its checkpointed
	// offsets to when a checkpoint completes (for monitoring: a restore
	// uses the checkpoint) and, with StartGroup, starts from; "" commits
	// nothing.
	Group string
	// Start is where a source without a checkpoint starts: StartEarliest
	// (default), StartLatest, StartTimestamp or StartGroup. Partitions found
	// later (new partitions, new topics of the regex) and partitions of a
	// restored source missing from its checkpoint start at their earliest.
	Start string
	// StartTimestamp is the time of StartTimestamp.
	StartTimestamp time.Time
	// Isolation is ReadCommitted (default) or ReadUncommitted.
	Isolation string
	// WatermarkLag: a partition's watermark is the largest record
	// timestamp read from it minus this (max out-of-orderness).
	WatermarkLag time.Duration
	// PartitionIdleTimeout: a partition that delivered no record for this
	// long stops holding the source's watermark back until it delivers
	// again; 0 never (an empty partition then holds it back for ever).
	PartitionIdleTimeout time.Duration
	// DiscoveryInterval is how often the source looks for new partitions
	// (and topics of TopicRegex) and refreshes its lag; default 10s,
	// negative: never.
	DiscoveryInterval time.Duration
}

// Validate reports every problem of c at once, each naming its field.
func (c *SourceConfig) Validate() error {
	errs := []error{c.Client.Validate()}
	switch {
	case len(c.Topics) == 0 && c.TopicRegex == "":
		errs = append(errs, errors.New("topics: give topics or topic_regex"))
	case len(c.Topics) > 0 && c.TopicRegex != "":
		errs = append(errs, errors.New("topics and topic_regex: give one of them, not both"))
	}
	for i, t := range c.Topics {
		if err := validTopic(t); err != nil {
			errs = append(errs, fmt.Errorf("topics[%d]: %w", i, err))
		}
	}
	if c.TopicRegex != "" {
		if _, err := regexp.Compile(c.TopicRegex); err != nil {
			errs = append(errs, fmt.Errorf("topic_regex: %w", err))
		}
	}
	switch c.Start {
	case "", StartEarliest, StartLatest, StartGroup:
		if !c.StartTimestamp.IsZero() {
			errs = append(errs, fmt.Errorf("start_timestamp: only with start %q", StartTimestamp))
		}
	case StartTimestamp:
		if c.StartTimestamp.IsZero() {
			errs = append(errs, fmt.Errorf("start_timestamp: start %q needs a time", StartTimestamp))
		}
	default:
		errs = append(errs, fmt.Errorf("start: unknown position %q (want %s, %s, %s or %s)", c.Start, StartEarliest, StartLatest, StartTimestamp, StartGroup))
	}
	if c.Start == StartGroup && c.Group == "" {
		errs = append(errs, fmt.Errorf("group: start %q needs a consumer group", StartGroup))
	}
	switch c.Isolation {
	case "", ReadCommitted, ReadUncommitted:
	default:
		errs = append(errs, fmt.Errorf("isolation: unknown level %q (want %s or %s)", c.Isolation, ReadCommitted, ReadUncommitted))
	}
	if c.WatermarkLag < 0 {
		errs = append(errs, fmt.Errorf("watermark_lag: %v is negative", c.WatermarkLag))
	}
	if c.PartitionIdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("partition_idle_timeout: %v is negative", c.PartitionIdleTimeout))
	}
	return errors.Join(errs...)
}

// Delivery guarantees of the sink (SinkConfig.Delivery).
const (
	ExactlyOnce = "exactly_once" // default: Sink
	AtLeastOnce = "at_least_once"
)

// SinkConfig configures the kafka sink.
type SinkConfig struct {
	Client ClientConfig
	Topic  string // where records go; it must exist
	// Delivery is ExactlyOnce (default, a transaction per checkpoint) or
	// AtLeastOnce (idempotent produce, flushed at each checkpoint).
	Delivery string
	// Job and Operator name the writer: its transactional ids and marker
	// groups derive from them (WriterID). Job must stay the same across the
	// attempts, failovers and restores of one job and differ between jobs
	// (the runtime gives a deployed job's id, or the job's name for
	// streamd run). Needed for ExactlyOnce.
	Job, Operator string
	// TransactionalIDPrefix prefixes the transactional ids and marker
	// groups; default "streamd".
	TransactionalIDPrefix string
	// TransactionTimeout bounds a transaction on the broker (it must not
	// exceed the broker's transaction.max.timeout.ms); default 60s.
	TransactionTimeout time.Duration
	// CheckpointInterval is the job's checkpoint interval
	// (connector.SinkEnv): the exactly-once sink's estimate of an epoch's
	// length until it has timed one (see Sink.goLive); 0: none known.
	CheckpointInterval time.Duration
}

// Validate reports every problem of c at once, each naming its field.
func (c *SinkConfig) Validate() error {
	errs := []error{c.Client.Validate()}
	if err := validTopic(c.Topic); err != nil {
		errs = append(errs, fmt.Errorf("topic: %w", err))
	}
	switch c.Delivery {
	case "", ExactlyOnce:
		if c.Job == "" || c.Operator == "" {
			errs = append(errs, errors.New("job and operator are needed to name the exactly-once writer"))
		}
	case AtLeastOnce:
	default:
		errs = append(errs, fmt.Errorf("delivery: unknown guarantee %q (want %s or %s)", c.Delivery, ExactlyOnce, AtLeastOnce))
	}
	if c.TransactionTimeout < 0 {
		errs = append(errs, fmt.Errorf("transaction_timeout: %v is negative", c.TransactionTimeout))
	}
	if strings.ContainsAny(c.TransactionalIDPrefix, " \t\n") {
		errs = append(errs, fmt.Errorf("transactional_id_prefix: %q has white space", c.TransactionalIDPrefix))
	}
	return errors.Join(errs...)
}

// validTopic checks Kafka's rules for a topic name.
func validTopic(t string) error {
	if t == "" {
		return errors.New("empty topic name")
	}
	if len(t) > 249 {
		return fmt.Errorf("topic %q is longer than 249 characters", t[:20]+"...")
	}
	if t == "." || t == ".." {
		return fmt.Errorf("topic %q is not allowed", t)
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topic %q: character %q is not allowed (letters, digits, '.', '_', '-')", t, r)
		}
	}
	return nil
}

// newClient makes a franz-go client of c with extra options.
func (c *ClientConfig) newClient(extra ...kgo.Opt) (*kgo.Client, error) {
	o, err := c.opts()
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append(o, extra...)...)
}

// ping fails early, with a clear error, when no broker answers.
func ping(ctx context.Context, cl *kgo.Client, what string, brokers []string) error {
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := cl.Ping(pctx); err != nil {
		return fmt.Errorf("kafka: %s: no broker of %s answers: %w", what, strings.Join(brokers, ","), err)
	}
	return nil
}
