package jobfile

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/connector"
)

// registerBroker registers, for the test, a source with a field of every
// type the loader knows (as a Kafka-like connector has them).
func registerBroker(t *testing.T) {
	t.Helper()
	spec := connector.NewConfigSpec().Summary("A test source with every field type.").
		Field(
			connector.NewStringListField("brokers").Description("Seed brokers.").Require("name the brokers"),
			connector.NewStringField("start").Description("Where to start.").Default("earliest").OneOf("start position", "earliest", "latest"),
			connector.NewIntField("max_bytes").Description("Fetch size.").Default(int64(1<<20)),
			connector.NewFloatField("ratio").Description("A number.").Default(0.5),
			connector.NewBoolField("committed").Description("read_committed.").Default(false),
			connector.NewDurationField("poll").Description("Poll interval.").Default(time.Second),
			connector.NewMillisField("lag").Description("A lag.").Default(time.Duration(0)),
			connector.NewPathField("ca_file").Description("A CA file."),
			connector.NewStringMapField("headers").Description("Headers to add."),
			connector.NewObjectField("sasl",
				connector.NewStringField("mechanism").Description("SASL mechanism.").Require("name the mechanism").OneOf("mechanism", "plain", "scram-sha-256"),
				connector.NewStringField("user").Description("User."),
			).Description("SASL options."),
		).
		EventTimestamp().
		Check(func(c connector.Config) []connector.FieldError {
			if c.String("start") == "latest" && c.Bool("committed") {
				return []connector.FieldError{connector.Errorf("committed", "not with start latest")}
			}
			return nil
		})
	if err := connector.RegisterSource("test_broker", spec, func(*connector.SourceSpec, connector.SourceEnv) (connector.Source, error) {
		return nil, errors.New("not run")
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { connector.Unregister("source", "test_broker") })
}

const brokerJob = "name: b\noperators:\n  - uid: in\n    source: %s\n  - uid: out\n    sink: {type: discard}\n    inputs: [in]\n"

// TestRegisteredSourceFields: a registered type's mapping is read from its
// spec: every field type, defaults, paths resolved, nested objects; and its
// problems are reported with their lines like the built-ins'.
func TestRegisteredSourceFields(t *testing.T) {
	registerBroker(t)
	src := `
      type: test_broker
      brokers: [a:9092, b:9092]
      max_bytes: 1024
      poll: 250ms
      lag: 1500
      ca_file: certs/ca.pem
      headers: {app: streamd, n: 3}
      sasl: {mechanism: plain, user: u}
      timestamp: {field: ts}`
	job, err := ParseJob([]byte(strings.Replace(brokerJob, "%s", src, 1)), "/base", Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := job.Graph.Vertex("in").Spec.(*SourceSpec)
	c := s.Conf()
	if s.Type != "test_broker" || s.TimestampField != "ts" || s.KeyPattern != "" {
		t.Errorf("spec %+v", s)
	}
	if !reflect.DeepEqual(c.StringList("brokers"), []string{"a:9092", "b:9092"}) || c.String("start") != "earliest" ||
		c.Int("max_bytes") != 1024 || c.Float("ratio") != 0.5 || c.Bool("committed") || c.Duration("poll") != 250*time.Millisecond ||
		c.Duration("lag") != 1500*time.Millisecond || c.String("ca_file") != "/base/certs/ca.pem" ||
		!reflect.DeepEqual(c.StringMap("headers"), map[string]string{"app": "streamd", "n": "3"}) ||
		c.Object("sasl").String("mechanism") != "plain" || c.Object("sasl").String("user") != "u" {
		t.Errorf("config %#v", c)
	}

	for _, tt := range []struct{ src, want string }{
		{"{type: test_broker}", `operator "in" (line 4): source.brokers: missing: name the brokers`},
		{"{type: test_broker, brokers: a, brokerz: b}", `source.brokerz: unknown field (did you mean "brokers"?)`},
		{"{type: test_broker, brokers: {a: 1}}", `source.brokers: want a list of strings like [a, b], got a mapping`},
		{"{type: test_broker, brokers: a, start: middle}", `source.start: unknown start position "middle" (want earliest or latest)`},
		{"{type: test_broker, brokers: a, max_bytes: lots}", `source.max_bytes: want an integer, got "lots"`},
		{"{type: test_broker, brokers: a, poll: 5}", `source.poll: want a duration like 500ms, 5s or 1m, got "5"`},
		{"{type: test_broker, brokers: a, sasl: {user: u}}", `source.sasl.mechanism: missing: name the mechanism`},
		{"{type: test_broker, brokers: a, sasl: {mechanism: md5}}", `source.sasl.mechanism: unknown mechanism "md5"`},
		{"{type: test_broker, brokers: a, sasl: {mechanism: plain, usr: u}}", `source.sasl.usr: unknown field (did you mean "user"?)`},
		{"{type: test_broker, brokers: a, start: latest, committed: true}", `source.committed: not with start latest`},
		{"{type: test_broker, brokers: a, count: 3}", `source.count: not a field of a test_broker source`},
		{"{type: generator, count: 3, brokers: a}", `source.brokers: not a field of a generator source`},
		{"{type: nope}", `unknown source type "nope" (want file, generator, nats`},
		{"{type: nope}", ` or test_broker)`},
	} {
		_, err := ParseJob([]byte(strings.Replace(brokerJob, "%s", tt.src, 1)), "/base", Options{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v\nwant %q", tt.src, err, tt.want)
		}
	}
}
