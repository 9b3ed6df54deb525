package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sync"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/connector"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Source is one subtask of the kafka source (connector.Source,
// connector.ReadySource, connector.LagSource, connector.CheckpointSource).
//
// Splits are partitions: subtask i of p reads the partitions p for which
// SubtaskFor(p, parallelism) is i, with a direct (group-less) consumer, so
// the assignment is the source's, not a group coordinator's, and it is the
// same after a restore. The position (EncodePosition) is the next offset of
// each of its partitions, the checkpoint stores it, and a restored subtask
// resumes exactly there; RedistributePositions spreads the positions of one
// parallelism over another. A record is the Kafka record's key, value and
// timestamp (ms); Kafka headers are dropped (abi.Record has no headers).
//
// Event time is the record timestamp. Each partition has its own watermark
// (largest timestamp read minus WatermarkLag); the source's is the smallest
// over its partitions that are not idle (no record for
// PartitionIdleTimeout), and never goes back.
//
// A discovery loop (every DiscoveryInterval) adds partitions that appear
// later, from their earliest offset, and refreshes the end offsets that Lag
// counts against. NotifyCheckpointComplete commits a checkpoint's offsets to
// Group, for monitoring tools; a restore never reads them.
type Source struct {
	name                 string
	cfg                  SourceConfig
	subtask, parallelism int
	cl                   *kgo.Client
	adm                  *kadm.Client
	re                   *regexp.Regexp
	now                  func() time.Time

	mu     sync.Mutex
	next   map[Partition]int64 // position: next offset to read
	parts  map[Partition]*partWM
	end    map[Partition]int64 // end offsets (high watermark or LSO) last seen
	lastWM int64
	err    error // of the discovery loop: Read returns it

	buf   []*kgo.Record // polled, not returned yet
	bufAt int
	// headers holds the records' header blocks.
	headers connector.HeaderArena

	commitPos chan []byte // latest completed checkpoint's position to commit
	commitErr error       // last group commit failure (under mu)
	commits   int         // group commits done (under mu)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type partWM struct {
	maxTS int64
	any   bool
	last  time.Time // of the last record, or when the partition was added
}

// NewSource opens subtask of a source of parallelism; pos is nil for a
// fresh start (cfg.Start), or a Position() (after RedistributePositions on
// a rescale) to resume from. Partitions in pos that are not this subtask's
// are ignored.
func NewSource(ctx context.Context, cfg SourceConfig, subtask, parallelism int, pos []byte) (*Source, error) {
	return newSource(ctx, cfg, subtask, parallelism, pos, time.Now)
}

func newSource(ctx context.Context, cfg SourceConfig, subtask, parallelism int, pos []byte, now func() time.Time) (*Source, error) {
	name := fmt.Sprintf("kafka source %v", cfg.Topics)
	if cfg.TopicRegex != "" {
		name = fmt.Sprintf("kafka source /%s/", cfg.TopicRegex)
	}
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return nil, fmt.Errorf("kafka: %s: subtask %d of parallelism %d", name, subtask, parallelism)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka: %s: %w", name, err)
	}
	var restored map[Partition]int64
	if pos != nil {
		var err error
		if restored, err = DecodePosition(pos); err != nil {
			return nil, fmt.Errorf("kafka: %s subtask %d: restore: %w", name, subtask, err)
		}
	}
	iso := kgo.ReadCommitted()
	if cfg.Isolation == ReadUncommitted {
		iso = kgo.ReadUncommitted()
	}
	if cfg.DiscoveryInterval == 0 {
		cfg.DiscoveryInterval = 10 * time.Second
	}
	cl, err := cfg.Client.newClient(
		kgo.FetchIsolationLevel(iso),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // a checkpointed offset gone by retention
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.MetadataMinAge(time.Second), // Discover sees new partitions a second later
	)
	if err != nil {
		return nil, fmt.Errorf("kafka: %s: %w", name, err)
	}
	s := &Source{
		name: name, cfg: cfg, subtask: subtask, parallelism: parallelism,
		cl: cl, adm: kadm.NewClient(cl), now: now,
		next: map[Partition]int64{}, parts: map[Partition]*partWM{}, end: map[Partition]int64{},
		lastWM: abi.MinWatermark, commitPos: make(chan []byte, 1),
	}
	if cfg.TopicRegex != "" {
		s.re = regexp.MustCompile("^(?:" + cfg.TopicRegex + ")$")
	}
	if err := s.open(ctx, restored, pos != nil); err != nil {
		cl.Close()
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if cfg.DiscoveryInterval > 0 {
		s.wg.Go(func() { s.discoverLoop(lctx) })
	}
	if cfg.Group != "" {
		s.wg.Go(func() { s.commitLoop(lctx) })
	}
	return s, nil
}

// open assigns the subtask's partitions at their first offsets.
func (s *Source) open(ctx context.Context, restored map[Partition]int64, isRestore bool) error {
	if err := ping(ctx, s.cl, s.name, s.cfg.Client.Brokers); err != nil {
		return err
	}
	mine, err := s.myPartitions(ctx, true)
	if err != nil {
		return err
	}
	start := map[Partition]int64{}
	var todo []Partition
	for _, p := range mine {
		if off, ok := restored[p]; ok {
			start[p] = off
		} else {
			todo = append(todo, p)
		}
	}
	mode := s.cfg.Start
	if isRestore {
		mode = StartEarliest // a partition the checkpoint did not know
	}
	resolved, err := s.resolve(ctx, todo, mode)
	if err != nil {
		return err
	}
	for p, off := range resolved {
		start[p] = off
	}
	s.assign(start)
	return nil
}

// myPartitions lists the partitions of the source's topics that are this
// subtask's. With strict, a named topic that does not exist is an error.
func (s *Source) myPartitions(ctx context.Context, strict bool) ([]Partition, error) {
	tds, err := s.adm.ListTopics(ctx, s.cfg.Topics...)
	if err != nil {
		return nil, fmt.Errorf("kafka: %s: list topics: %w", s.name, err)
	}
	var out []Partition
	for _, td := range tds {
		if s.re != nil && (td.IsInternal || !s.re.MatchString(td.Topic)) {
			continue
		}
		if td.Err != nil {
			if strict {
				return nil, fmt.Errorf("kafka: %s: topic %q: %w", s.name, td.Topic, td.Err)
			}
			continue
		}
		for _, pd := range td.Partitions {
			p := Partition{Topic: td.Topic, Partition: pd.Partition}
			if SubtaskFor(p, s.parallelism) == s.subtask {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// resolve finds the first offset of each partition under a start mode.
func (s *Source) resolve(ctx context.Context, ps []Partition, mode string) (map[Partition]int64, error) {
	out := map[Partition]int64{}
	if len(ps) == 0 {
		return out, nil
	}
	var topics []string
	seen := map[string]bool{}
	for _, p := range ps {
		if !seen[p.Topic] {
			seen[p.Topic] = true
			topics = append(topics, p.Topic)
		}
	}
	list := func(what string, f func(context.Context, ...string) (kadm.ListedOffsets, error)) (kadm.ListedOffsets, error) {
		l, err := f(ctx, topics...)
		if err == nil {
			err = l.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("kafka: %s subtask %d: list %s offsets: %w", s.name, s.subtask, what, err)
		}
		return l, nil
	}
	var group kadm.OffsetResponses
	var l kadm.ListedOffsets
	var err error
	switch mode {
	case StartLatest:
		l, err = list("end", s.adm.ListEndOffsets)
	case StartTimestamp:
		l, err = list("timestamp", func(ctx context.Context, ts ...string) (kadm.ListedOffsets, error) {
			return s.adm.ListOffsetsAfterMilli(ctx, s.cfg.StartTimestamp.UnixMilli(), ts...)
		})
	case StartGroup:
		group, err = s.adm.FetchOffsets(ctx, s.cfg.Group)
		if err == nil {
			err = group.Error()
		}
		if errors.Is(err, kerr.GroupIDNotFound) {
			group, err = nil, nil // a new group: earliest everywhere
		}
		if err != nil {
			return nil, fmt.Errorf("kafka: %s subtask %d: offsets of group %q: %w", s.name, s.subtask, s.cfg.Group, err)
		}
		fallthrough
	default:
		l, err = list("start", s.adm.ListStartOffsets)
	}
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		if o, ok := group.Lookup(p.Topic, p.Partition); ok && o.At >= 0 {
			out[p] = o.At
			continue
		}
		lo, ok := l.Lookup(p.Topic, p.Partition)
		if !ok || lo.Offset < 0 {
			return nil, fmt.Errorf("kafka: %s subtask %d: no %s offset for partition %s", s.name, s.subtask, mode, p)
		}
		out[p] = lo.Offset
	}
	return out, nil
}

// assign starts reading partitions at the given offsets.
func (s *Source) assign(start map[Partition]int64) {
	if len(start) == 0 {
		return
	}
	add := map[string]map[int32]kgo.Offset{}
	now := s.now()
	s.mu.Lock()
	for p, off := range start {
		s.next[p] = off
		s.parts[p] = &partWM{last: now}
		if add[p.Topic] == nil {
			add[p.Topic] = map[int32]kgo.Offset{}
		}
		add[p.Topic][p.Partition] = kgo.NewOffset().At(off)
	}
	s.mu.Unlock()
	s.cl.AddConsumePartitions(add)
}

// discoverLoop adds new partitions and refreshes end offsets.
func (s *Source) discoverLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.DiscoveryInterval)
	defer t.Stop()
	for {
		s.refreshEnds(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.Discover(ctx); err != nil && ctx.Err() == nil {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
		}
	}
}

// Discover adds the partitions of this subtask that appeared since it
// looked last, from their earliest offset. The discovery loop calls it;
// tests call it to not wait for the interval.
func (s *Source) Discover(ctx context.Context) error {
	mine, err := s.myPartitions(ctx, false)
	if err != nil {
		return err
	}
	var todo []Partition
	s.mu.Lock()
	for _, p := range mine {
		if _, ok := s.next[p]; !ok {
			todo = append(todo, p)
		}
	}
	s.mu.Unlock()
	start, err := s.resolve(ctx, todo, StartEarliest)
	if err != nil {
		return err
	}
	s.assign(start)
	return nil
}

// refreshEnds lists the end offsets of the subtask's partitions for Lag.
func (s *Source) refreshEnds(ctx context.Context) {
	s.mu.Lock()
	seen := map[string]bool{}
	var topics []string
	for p := range s.next {
		if !seen[p.Topic] {
			seen[p.Topic] = true
			topics = append(topics, p.Topic)
		}
	}
	s.mu.Unlock()
	if len(topics) == 0 {
		return
	}
	var l kadm.ListedOffsets
	var err error
	if s.cfg.Isolation == ReadUncommitted {
		l, err = s.adm.ListEndOffsets(ctx, topics...)
	} else {
		l, err = s.adm.ListCommittedOffsets(ctx, topics...)
	}
	if err != nil {
		return // lag stays as it was; informational
	}
	s.mu.Lock()
	l.Each(func(o kadm.ListedOffset) {
		p := Partition{o.Topic, o.Partition}
		if _, mine := s.next[p]; mine && o.Err == nil && o.Offset >= 0 {
			s.end[p] = o.Offset
		}
	})
	s.mu.Unlock()
}

// Read fills recs with the next records of the subtask's partitions.
func (s *Source) Read(ctx context.Context, recs []abi.Record) (int, error) {
	for s.bufAt == len(s.buf) {
		s.mu.Lock()
		err := s.err
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
		if err := s.poll(ctx, len(recs)); err != nil {
			return 0, err
		}
	}
	n := 0
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for n < len(recs) && s.bufAt < len(s.buf) {
		r := s.buf[s.bufAt]
		s.buf[s.bufAt] = nil
		s.bufAt++
		p := Partition{r.Topic, r.Partition}
		if _, mine := s.next[p]; !mine {
			continue
		}
		ts := abi.NoTimestamp
		if ms := r.Timestamp.UnixMilli(); ms >= 0 {
			ts = ms
		}
		recs[n] = abi.Record{Key: r.Key, Value: r.Value, Timestamp: ts, Headers: headerBlock(&s.headers, r.Headers)}
		n++
		s.next[p] = r.Offset + 1
		w := s.parts[p]
		w.last = now
		if ts != abi.NoTimestamp && (!w.any || ts > w.maxTS) {
			w.maxTS, w.any = ts, true
		}
	}
	return n, nil
}

// poll waits for the next fetched records.
func (s *Source) poll(ctx context.Context, max int) error {
	fs := s.cl.PollRecords(ctx, max)
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	if fs.IsClientClosed() {
		return errClosed
	}
	var ferr error
	fs.EachError(func(t string, p int32, err error) {
		var loss *kgo.ErrDataLoss
		if ferr != nil || errors.As(err, &loss) || kerr.IsRetriable(err) || errors.Is(err, context.Canceled) {
			return // data loss: the broker moved us on (retention); retriable: kgo retries
		}
		ferr = fmt.Errorf("kafka: %s subtask %d: fetch %s/%d: %w", s.name, s.subtask, t, p, err)
	})
	if ferr != nil {
		return ferr
	}
	s.mu.Lock()
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		end := fp.HighWatermark
		if s.cfg.Isolation != ReadUncommitted {
			end = fp.LastStableOffset
		}
		if p := (Partition{fp.Topic, fp.Partition}); end >= 0 {
			if _, mine := s.next[p]; mine {
				s.end[p] = end
			}
		}
	})
	s.mu.Unlock()
	s.buf, s.bufAt = fs.Records(), 0
	return nil
}

// Ready reports whether records are buffered, so a Read returns at once.
func (s *Source) Ready() bool {
	return s.bufAt < len(s.buf) || s.cl.BufferedFetchRecords() > 0
}

// Watermark is the smallest watermark of the partitions that are not idle;
// abi.MinWatermark while one of them has delivered nothing. It never goes
// back; with every partition idle it stays where it was.
func (s *Source) Watermark() int64 {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	lag := s.cfg.WatermarkLag.Milliseconds()
	wm, active := int64(math.MaxInt64), false
	for _, w := range s.parts {
		if s.cfg.PartitionIdleTimeout > 0 && now.Sub(w.last) >= s.cfg.PartitionIdleTimeout {
			continue
		}
		active = true
		if !w.any {
			return s.lastWM
		}
		pw := abi.MinWatermark
		if w.maxTS >= math.MinInt64+lag {
			pw = w.maxTS - lag
		}
		wm = min(wm, pw)
	}
	if active && wm > s.lastWM {
		s.lastWM = wm
	}
	return s.lastWM
}

// Position encodes the next offset of each of the subtask's partitions.
func (s *Source) Position() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return EncodePosition(s.next)
}

// Partitions lists the partitions the subtask reads.
func (s *Source) Partitions() []Partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Partition, 0, len(s.next))
	for p := range s.next {
		out = append(out, p)
	}
	return out
}

// Lag is the number of offsets between the subtask's position and the end
// of its partitions (the high watermark; under read_committed the last
// stable offset), summed; ok is false before any end is known. Offsets of
// transaction markers count too, so a topic written with transactions
// shows a lag of about one per partition when the source is caught up.
func (s *Source) Lag() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	ok := false
	for p, end := range s.end {
		ok = true
		if d := end - s.next[p]; d > 0 {
			n += d
		}
	}
	return n, ok
}

// NotifyCheckpointComplete (connector.CheckpointSource) commits pos, the
// position the completed checkpoint id stored for this subtask, to the
// consumer group (when one is
// configured), in the background: only monitoring reads it. A newer call
// replaces a commit not started yet. It never blocks and never fails;
// CommitError reports the last failure.
func (s *Source) NotifyCheckpointComplete(id int64, pos []byte) error {
	if s.cfg.Group == "" || pos == nil {
		return nil
	}
	select {
	case <-s.commitPos:
	default:
	}
	s.commitPos <- pos
	return nil
}

func (s *Source) commitLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case pos := <-s.commitPos:
			err := s.commitGroup(ctx, pos)
			s.mu.Lock()
			s.commitErr = err
			if err == nil {
				s.commits++
			}
			s.mu.Unlock()
		}
	}
}

func (s *Source) commitGroup(ctx context.Context, pos []byte) error {
	m, err := DecodePosition(pos)
	if err != nil {
		return err
	}
	var os kadm.Offsets
	for p, off := range m {
		os.Add(kadm.Offset{Topic: p.Topic, Partition: p.Partition, At: off, LeaderEpoch: -1})
	}
	if len(os) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := s.adm.CommitOffsets(cctx, s.cfg.Group, os)
	if err == nil {
		err = r.Error()
	}
	if err != nil {
		return fmt.Errorf("kafka: %s subtask %d: commit offsets to group %q: %w", s.name, s.subtask, s.cfg.Group, err)
	}
	return nil
}

// GroupCommits reports how many group commits succeeded and the last
// commit error (nil after a success).
func (s *Source) GroupCommits() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commits, s.commitErr
}

// Close stops the source's loops and its client.
func (s *Source) Close() error {
	s.cancel()
	s.wg.Wait()
	s.cl.Close()
	return nil
}
