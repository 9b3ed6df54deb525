package kafka

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector"
	"github.com/twmb/franz-go/pkg/kgo"
)

// AtLeastOnceSink is the kafka sink without transactions
// (connector.Sink): Write produces at once with an idempotent producer
// (no duplicates from the client's own retries), and Flush, which the
// runtime calls at every checkpoint barrier, waits until every record is
// acknowledged. A record written before a checkpoint is therefore in Kafka
// when the checkpoint completes; a restore replays, and produces again,
// what came after it: at least once. Key, value, timestamp, headers and
// partitioning are as in Sink.
type AtLeastOnceSink struct {
	name    string
	subtask int
	topic   string
	cl      *kgo.Client

	mu  sync.Mutex
	err error // first produce failure; every later call returns it
}

// NewAtLeastOnceSink opens an at-least-once sink subtask.
func NewAtLeastOnceSink(ctx context.Context, cfg SinkConfig, subtask, parallelism int) (*AtLeastOnceSink, error) {
	name := "kafka sink " + cfg.Topic
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("kafka: %s: subtask %d of parallelism %d", name, subtask, parallelism)
	}
	if cfg.Delivery == "" {
		cfg.Delivery = AtLeastOnce
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka: %s: %w", name, err)
	}
	cl, err := cfg.Client.newClient(kgo.DefaultProduceTopic(cfg.Topic), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return nil, fmt.Errorf("kafka: %s: %w", name, err)
	}
	if err := ping(ctx, cl, name, cfg.Client.Brokers); err != nil {
		cl.Close()
		return nil, err
	}
	return &AtLeastOnceSink{name: name, subtask: subtask, topic: cfg.Topic, cl: cl}, nil
}

// NewAnySink opens the sink cfg.Delivery asks for: *Sink (exactly once, the
// default) or *AtLeastOnceSink.
func NewAnySink(ctx context.Context, cfg SinkConfig, subtask, parallelism int) (connector.Sink, error) {
	if cfg.Delivery == AtLeastOnce {
		return NewAtLeastOnceSink(ctx, cfg, subtask, parallelism)
	}
	return NewSink(ctx, cfg, subtask, parallelism)
}

func (s *AtLeastOnceSink) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Write produces recs. The client keeps the records until they are
// acknowledged and copies nothing, so Write copies their keys, values and
// headers, all into one buffer, and allocates their kgo.Records in one
// slice: two allocations a batch, not three a record.
func (s *AtLeastOnceSink) Write(recs []abi.Record) error {
	if err := s.failed(); err != nil {
		return err
	}
	size := 0
	for i := range recs {
		size += len(recs[i].Key) + len(recs[i].Value) + len(recs[i].Headers)
	}
	buf := make([]byte, 0, size)
	krs := make([]kgo.Record, len(recs))
	for i := range recs {
		r, kr := &recs[i], &krs[i]
		kr.Topic = s.topic
		buf, kr.Key = appendField(buf, r.Key)
		buf, kr.Value = appendField(buf, r.Value)
		if len(r.Headers) > 0 {
			var h []byte
			buf, h = appendField(buf, r.Headers)
			kr.Headers = kafkaHeaders(h)
		}
		if r.Timestamp != abi.NoTimestamp {
			kr.Timestamp = time.UnixMilli(r.Timestamp)
		}
		s.cl.Produce(context.Background(), kr, s.done)
	}
	return nil
}

// appendField appends f to buf and returns buf and the copy (nil when f
// is empty: a Kafka null, as an empty key or value has always been).
func appendField(buf, f []byte) ([]byte, []byte) {
	if len(f) == 0 {
		return buf, nil
	}
	at := len(buf)
	buf = append(buf, f...)
	return buf, buf[at:len(buf):len(buf)]
}

func (s *AtLeastOnceSink) done(_ *kgo.Record, err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	if s.err == nil {
		s.err = fmt.Errorf("kafka: %s subtask %d: produce: %w", s.name, s.subtask, err)
	}
	s.mu.Unlock()
}

// Flush waits until every record written is acknowledged.
func (s *AtLeastOnceSink) Flush() error {
	if err := s.cl.Flush(context.Background()); err != nil {
		return fmt.Errorf("kafka: %s subtask %d: flush: %w", s.name, s.subtask, err)
	}
	return s.failed()
}

// Close waits a while for the records in flight and releases the client.
// It is also called after a failure: unacknowledged records are then
// produced again by the restore.
func (s *AtLeastOnceSink) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.cl.Flush(ctx)
	s.cl.Close()
	if err != nil {
		return fmt.Errorf("kafka: %s subtask %d: close: %w", s.name, s.subtask, err)
	}
	return s.failed()
}

var (
	_ connector.Sink         = (*AtLeastOnceSink)(nil)
	_ connector.TwoPhaseSink = (*Sink)(nil)
	_ connector.Source       = (*Source)(nil)
	_ connector.ReadySource  = (*Source)(nil)
	_ connector.LagSource    = (*Source)(nil)

	_ connector.CheckpointSource = (*Source)(nil)
)
