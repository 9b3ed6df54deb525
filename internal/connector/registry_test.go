package connector

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestBuiltinOrder: the built-in types come first, in the order the
// job-file messages have always listed them.
func TestBuiltinOrder(t *testing.T) {
	if got := SourceNames(); !reflect.DeepEqual(got[:3], []string{"file", "generator", "nats"}) {
		t.Errorf("sources %v", got)
	}
	if got := SinkNames(); !reflect.DeepEqual(got[:4], []string{"file", "stdout", "discard", "nats"}) {
		t.Errorf("sinks %v", got)
	}
}

// TestRegisterRefusesBadSpecs: a registration names what is wrong.
func TestRegisterRefusesBadSpecs(t *testing.T) {
	ok := func() *ConfigSpec { return NewConfigSpec().Summary("s") }
	ctor := func(*SourceSpec, SourceEnv) (Source, error) { return nil, nil }
	for _, tt := range []struct {
		name string
		spec *ConfigSpec
		want string
	}{
		{"file", ok(), `source type "file" is registered twice`},
		{"Bad", ok(), `want a lower-case name`},
		{"t1", nil, `no config spec`},
		{"t2", NewConfigSpec(), `no summary`},
		{"t3", ok().Field(NewStringField("a")), `field "a" has no description`},
		{"t4", ok().Field(NewStringField("a").Description("d"), NewIntField("a").Description("d")), `field "a" given twice`},
		{"t5", ok().Field(NewStringField("watermark").Description("d")), `field "watermark" given twice`},
		{"t6", ok().Field(NewIntField("a").Description("d").OneOf("x", "y")), `only a string field takes OneOf`},
		{"t7", ok().Field(NewStringField("a").Description("d").Require("x").Default("y")), `required and has a default`},
		{"t8", ok().Field(NewObjectField("tls", NewStringField("CA").Description("d")).Description("d")), `field "tls.CA": want a lower-case name`},
	} {
		err := RegisterSource(tt.name, tt.spec, ctor)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
			Unregister("source", tt.name)
		}
	}
}

// TestConfigJSON: a registered type's values survive the JSON of a
// deployed job's spec, large integers and durations included.
func TestConfigJSON(t *testing.T) {
	c := Config{"n": int64(1<<62 + 1), "d": 1500 * time.Millisecond, "s": "x", "l": []string{"a", "b"},
		"b": true, "f": 0.5, "o": Config{"ca": "/x"}, "m": map[string]string{"k": "v"}}
	in := SourceSpec{Type: "toy", Config: &c}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out SourceSpec
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	o := out.Conf()
	if o.Int("n") != 1<<62+1 || o.Duration("d") != 1500*time.Millisecond || o.String("s") != "x" ||
		!reflect.DeepEqual(o.StringList("l"), []string{"a", "b"}) || !o.Bool("b") || o.Float("f") != 0.5 ||
		o.Object("o").String("ca") != "/x" || o.StringMap("m")["k"] != "v" {
		t.Errorf("after JSON: %#v (%s)", o, b)
	}
	// A built-in type's spec keeps its JSON of before the registry.
	b, _ = json.Marshal(SourceSpec{Type: "generator", Count: 3})
	if strings.Contains(string(b), "Config") {
		t.Errorf("built-in spec JSON has a Config: %s", b)
	}
}

// TestDescribe: the built-ins' own lines, and the default line of a type
// without one (the values that differ from their default).
func TestDescribe(t *testing.T) {
	if got := DescribeSource(&SourceSpec{Type: "nats", Stream: "S", Bounded: true}); got != "source nats stream S bounded" {
		t.Errorf("nats: %q", got)
	}
	if got := DescribeSink(&SinkSpec{Type: "file", Path: "/o", Format: "kv"}); got != "sink file /o"+string(filepath.Separator)+" format=kv" {
		t.Errorf("file: %q", got)
	}
	spec := NewConfigSpec().Summary("toy").Field(
		NewIntField("count").Description("n").Require("count"),
		NewStringField("prefix").Description("p").Default("n"))
	MustRegisterSource("describe_toy", spec, func(*SourceSpec, SourceEnv) (Source, error) { return nil, nil })
	defer Unregister("source", "describe_toy")
	c := Config{"count": int64(3), "prefix": "n"}
	if got := DescribeSource(&SourceSpec{Type: "describe_toy", Config: &c}); got != "source describe_toy count=3" {
		t.Errorf("default describe: %q", got)
	}
}
