package jobfile

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/streamd/streamd/internal/connector"
)

// Sources and sinks are read from the connector registry: a mapping's
// type names a registered connector, whose ConfigSpec lists its fields.
// The loader checks each field's type, Required and OneOf, applies the
// defaults, runs the spec's Check and binds the values into the
// SourceSpec or SinkSpec (connector.Plugin.BindSource); every problem is
// reported at its line, like the rest of the job file.

// sourceCommon are the fields of every source mapping besides its type's
// (timestamp only for a type marked EventTimestamp).
var (
	sourceCommon    = []string{"timestamp", "watermark", "watermark_lag"}
	watermarkFields = []string{"max_out_of_orderness", "idle_timeout", "interval"}
)

// CheckSubject checks a NATS subject (connector.CheckSubject).
func CheckSubject(subj string, wildcards bool) error { return connector.CheckSubject(subj, wildcards) }

func (p *parser) source(op, prefix string, n *yaml.Node) *SourceSpec {
	prefix += "source."
	if n.Kind != yaml.MappingNode {
		p.add(op, n.Line, strings.TrimSuffix(prefix, "."), "want a mapping like {type: file, path: input.txt}")
		return nil
	}
	names := connector.SourceNames()
	t, plugin, known, other := connectorType(n, connector.Sources(), sourceCommon, func(p *connector.Plugin) []string {
		if p.Spec.TakesTimestamp() {
			return sourceCommon
		}
		return sourceCommon[1:]
	})
	f := p.connectorFields(op, prefix, n, known, other, plugin, "source")
	if t == nil {
		p.add(op, n.Line, prefix+"type", "missing (want %s)", orList(names))
		return nil
	}
	s := &SourceSpec{Type: p.str(op, prefix+"type", t)}
	p.eventTime(op, prefix, f, s)
	if plugin == nil {
		if s.Type != "" {
			p.add(op, t.Line, prefix+"type", "unknown source type %q (want %s)", s.Type, orList(names))
		}
		return s
	}
	c := p.checkedConfig(op, prefix, n, f, plugin)
	wm := *s
	plugin.BindSource(c, s)
	s.TimestampField, s.WatermarkLag, s.IdleTimeout, s.WatermarkInterval = wm.TimestampField, wm.WatermarkLag, wm.IdleTimeout, wm.WatermarkInterval
	return s
}

func (p *parser) sink(op, prefix string, n *yaml.Node) *SinkSpec {
	return p.sinkAt(op, prefix+"sink.", n)
}

// sinkAt parses the sink mapping n whose fields are named prefix+field.
func (p *parser) sinkAt(op, prefix string, n *yaml.Node) *SinkSpec {
	if n.Kind != yaml.MappingNode {
		p.add(op, n.Line, strings.TrimSuffix(prefix, "."), "want a mapping like {type: file, path: out/}")
		return nil
	}
	names := connector.SinkNames()
	t, plugin, known, other := connectorType(n, connector.Sinks(), nil, func(*connector.Plugin) []string { return nil })
	f := p.connectorFields(op, prefix, n, known, other, plugin, "sink")
	if t == nil {
		p.add(op, n.Line, prefix+"type", "missing (want %s)", strings.Join(names, ", "))
		return nil
	}
	s := &SinkSpec{Type: p.str(op, prefix+"type", t), Format: "value"}
	if plugin == nil {
		if s.Type != "" {
			p.add(op, t.Line, prefix+"type", "unknown sink type %q (want %s)", s.Type, strings.Join(names, ", "))
		}
		return s
	}
	plugin.BindSink(p.checkedConfig(op, prefix, n, f, plugin), s)
	return s
}

// connectorType finds the type of connector mapping n among plugins
// (plugin nil: missing or not registered) and the keys the mapping may
// have: known, its type's fields and those common gives it, and other,
// the fields of the other types and every common one (allCommon), which
// are "not a field of" this type rather than unknown.
func connectorType(n *yaml.Node, plugins []*connector.Plugin, allCommon []string, common func(*connector.Plugin) []string) (
	t *yaml.Node, plugin *connector.Plugin, known []string, other map[string]bool) {
	if t = findKey(n, "type"); t != nil && t.Kind == yaml.ScalarNode && t.Tag != "!!null" {
		if i := slices.IndexFunc(plugins, func(p *connector.Plugin) bool { return p.Name == t.Value }); i >= 0 {
			plugin = plugins[i]
		}
	}
	known, other = []string{"type"}, map[string]bool{}
	if plugin != nil {
		known = append(append(known, common(plugin)...), fieldNames(plugin.Spec.Fields())...)
	}
	for _, q := range plugins {
		if q == plugin {
			continue
		}
		for _, k := range append(fieldNames(q.Spec.Fields()), allCommon...) {
			if !contains(known, k) {
				other[k] = true
			}
		}
	}
	return t, plugin, known, other
}

// connectorFields returns the fields of connector mapping n by key. A key
// in other (a field of another type of the same kind) is "not a field of
// a <type> <kind>" when the type is known; other unknown keys get a
// suggestion among known.
func (p *parser) connectorFields(op, prefix string, n *yaml.Node, known []string, other map[string]bool, plugin *connector.Plugin, kind string) map[string]*yaml.Node {
	all := append([]string{}, known...)
	for k := range other {
		all = append(all, k)
	}
	f := p.fields(op, prefix, n, all)
	for k, c := range f {
		if contains(known, k) {
			continue
		}
		if plugin != nil {
			p.add(op, c.Line, prefix+k, "not a field of a %s %s", plugin.Name, kind)
		}
		delete(f, k)
	}
	return f
}

func fieldNames(fs []*connector.Field) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Name
	}
	return out
}

// joinField names field of a connector mapping ("" the mapping itself).
func joinField(prefix, field string) string {
	if field == "" {
		return strings.TrimSuffix(prefix, ".")
	}
	return prefix + field
}

// fieldLine is the line of field (a dotted path) in mapping n, else of the
// nearest mapping that holds it.
func (p *parser) fieldLine(n *yaml.Node, field string) int {
	line := n.Line
	for _, k := range strings.Split(field, ".") {
		if k == "" || n == nil || n.Kind != yaml.MappingNode {
			break
		}
		c := findKey(n, k)
		if c == nil {
			break
		}
		line, n = c.Line, c
	}
	return line
}

// checkedConfig reads the values of plugin's fields from f (the keys of
// mapping n) and runs its spec's Check, reporting each problem at its line.
func (p *parser) checkedConfig(op, prefix string, n *yaml.Node, f map[string]*yaml.Node, plugin *connector.Plugin) connector.Config {
	c := p.connectorConfig(op, prefix, n, f, plugin.Spec.Fields())
	for _, fe := range plugin.Spec.CheckConfig(c) {
		p.add(op, p.fieldLine(n, fe.Field), joinField(prefix, fe.Field), "%s", fe.Message)
	}
	return c
}

// connectorConfig reads the values of fields from f (the keys of mapping
// n), with their defaults, reporting a wrong type, a missing required
// field and a value outside OneOf.
func (p *parser) connectorConfig(op, prefix string, n *yaml.Node, f map[string]*yaml.Node, fields []*connector.Field) connector.Config {
	c := connector.Config{}
	for _, fd := range fields {
		x := f[fd.Name]
		field := prefix + fd.Name
		if x == nil {
			if fd.Required {
				p.add(op, n.Line, field, "missing: %s", cmpOr(fd.MissingHint, fd.Doc))
			} else if fd.DefaultValue != nil {
				c[fd.Name] = fd.DefaultValue
			}
			continue
		}
		if v, ok := p.connectorValue(op, field, x, fd); ok {
			c[fd.Name] = v
		}
	}
	return c
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// connectorValue reads one value of field type fd.Type.
func (p *parser) connectorValue(op, field string, x *yaml.Node, fd *connector.Field) (any, bool) {
	switch fd.Type {
	case connector.TypeString:
		if x.Kind != yaml.ScalarNode || x.Tag == "!!null" {
			p.add(op, x.Line, field, "want a string")
			return nil, false
		}
		if len(fd.Enum) > 0 && !contains(fd.Enum, x.Value) {
			p.add(op, x.Line, field, "unknown %s %q (want %s)", cmpOr(fd.EnumWhat, fd.Name), x.Value, orList(fd.Enum))
			return nil, false
		}
		return x.Value, true
	case connector.TypePath:
		if x.Kind == yaml.ScalarNode && x.Value == "-" {
			return "-", true
		}
		s := p.path(op, field, x)
		return s, s != ""
	case connector.TypeInt:
		return p.int64(op, field, x)
	case connector.TypeFloat:
		return p.float(op, field, x)
	case connector.TypeBool:
		if x.Kind != yaml.ScalarNode || x.Tag != "!!bool" {
			p.bool(op, field, x) // reports
			return nil, false
		}
		return p.bool(op, field, x), true
	case connector.TypeDuration:
		return p.duration(op, field, x)
	case connector.TypeMillis:
		return p.durationOrMillis(op, field, x)
	case connector.TypeStringList:
		if x.Kind == yaml.ScalarNode && x.Tag == "!!str" {
			return []string{x.Value}, true // a one-element list may be written bare
		}
		if x.Kind != yaml.SequenceNode {
			p.add(op, x.Line, field, "want a list of strings like [a, b], got %s", describe(x))
			return nil, false
		}
		out := []string{}
		for i, e := range x.Content {
			e = resolve(e)
			if e.Kind != yaml.ScalarNode || e.Tag == "!!null" {
				p.add(op, e.Line, fmt.Sprintf("%s[%d]", field, i), "want a string")
				return nil, false
			}
			out = append(out, e.Value)
		}
		return out, true
	case connector.TypeStringMap:
		m := p.config(op, field, x)
		return m, true
	case connector.TypeObject:
		if x.Kind != yaml.MappingNode {
			p.add(op, x.Line, field, "want a mapping with %s", orList(fieldNames(fd.Fields)))
			return nil, false
		}
		sub := p.fields(op, field+".", x, fieldNames(fd.Fields))
		return p.connectorConfig(op, field+".", x, sub, fd.Fields), true
	}
	p.add(op, x.Line, field, "field type %q is not known to the loader", fd.Type)
	return nil, false
}

// sinkTakesDeadLetters reports whether sink type typ is registered and
// may take dead letters, and names the types that may.
func sinkTakesDeadLetters(typ string) (known, ok bool, which []string) {
	for _, q := range connector.Sinks() {
		if q.Spec.TakesDeadLetters() {
			which = append(which, q.Name)
		}
		if q.Name == typ {
			known, ok = true, q.Spec.TakesDeadLetters()
		}
	}
	return known, ok, which
}
