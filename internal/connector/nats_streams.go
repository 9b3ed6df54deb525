package connector

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamUse tells which stream a transform reads or writes and whether it
// was created for it (with check: would be).
type StreamUse struct {
	Stream  string
	Created bool
}

// Prefixes of the streams a transform creates (TransformStreamName).
const (
	TransformInputPrefix  = "STREAMD_IN_"
	TransformOutputPrefix = "STREAMD_OUT_"
)

// TransformStreamName is the stream a transform creates for subject:
// prefix and the subject with '.' as '_', '*' as "any" and '>' as "all"
// (orders.*.eu: STREAMD_IN_orders_any_eu).
func TransformStreamName(prefix, subject string) string {
	toks := strings.Split(subject, ".")
	for i, t := range toks {
		switch t {
		case "*":
			toks[i] = "any"
		case ">":
			toks[i] = "all"
		}
	}
	return prefix + strings.Join(toks, "_")
}

// InputStream finds the stream that captures every message on subject
// (which may have wildcards), or creates one named
// TransformStreamName(TransformInputPrefix, subject) for it when no stream
// captures any of them. A stream that captures only some of them is an
// error, since the source would miss the others. With check nothing is
// created.
func InputStream(ctx context.Context, js jetstream.JetStream, subject string, check bool) (StreamUse, error) {
	lister := js.StreamNames(ctx, jetstream.WithStreamListSubject(subject))
	var names []string
	for n := range lister.Name() {
		names = append(names, n)
	}
	if err := lister.Err(); err != nil {
		return StreamUse{}, fmt.Errorf("connector: find the stream of %s: %w", subject, err)
	}
	var partial []string
	for _, n := range names {
		st, err := js.Stream(ctx, n)
		if err != nil {
			return StreamUse{}, fmt.Errorf("connector: stream %s: %w", n, err)
		}
		cfg := st.CachedInfo().Config
		for _, s := range cfg.Subjects {
			if server.SubjectMatchesFilter(subject, s) {
				return StreamUse{Stream: n}, nil
			}
		}
		partial = append(partial, fmt.Sprintf("%s (subjects %s)", n, strings.Join(cfg.Subjects, ", ")))
	}
	if len(partial) > 0 {
		return StreamUse{}, fmt.Errorf("connector: no stream captures all of %s, only part: %s; read one with jetstream:STREAM:FILTER", subject, strings.Join(partial, "; "))
	}
	name := TransformStreamName(TransformInputPrefix, subject)
	if check {
		return StreamUse{Stream: name, Created: true}, nil
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}}); err != nil {
		return StreamUse{}, fmt.Errorf("connector: create stream %s for %s: %w", name, subject, err)
	}
	return StreamUse{Stream: name, Created: true}, nil
}

// OutputStream finds the stream that captures subject, a nats sink's, and
// checks that the sink can commit into it (allow_atomic, the commit subject
// commitPrefix.> captured); with none it creates one named
// TransformStreamName(TransformOutputPrefix, subject) that captures subject
// and commitPrefix.> and allows atomic publish. With check nothing is
// created.
func OutputStream(ctx context.Context, js jetstream.JetStream, subject, commitPrefix string, check bool) (StreamUse, error) {
	if commitPrefix == "" {
		commitPrefix = DefaultCommitSubject(subject)
	}
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		name = TransformStreamName(TransformOutputPrefix, subject)
		if check {
			return StreamUse{Stream: name, Created: true}, nil
		}
		cfg := jetstream.StreamConfig{Name: name, Subjects: []string{subject, commitPrefix + ".>"}, AllowAtomicPublish: true}
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			return StreamUse{}, fmt.Errorf("connector: create stream %s for %s: %w", name, subject, err)
		}
		return StreamUse{Stream: name, Created: true}, nil
	case err != nil:
		return StreamUse{}, fmt.Errorf("connector: find the stream of %s: %w", subject, err)
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return StreamUse{}, fmt.Errorf("connector: stream %s: %w", name, err)
	}
	cfg := st.CachedInfo().Config
	if err := checkSinkStream(ctx, js, &cfg, commitPrefix+".check.0", commitPrefix); err != nil {
		return StreamUse{}, fmt.Errorf("connector: output %s: %w", subject, err)
	}
	return StreamUse{Stream: name}, nil
}
