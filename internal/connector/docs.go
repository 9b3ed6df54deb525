package connector

import (
	"bytes"
	"fmt"
	"strings"
)

// Markdown is docs/connectors.md: every registered source and sink with
// its summary, description, fields and example, generated from the specs
// (internal/connector/all's TestConnectorsDoc, which sees every connector,
// keeps the file current; `go generate ./internal/connector/all` rewrites
// it).
func Markdown() []byte {
	var b bytes.Buffer
	b.WriteString(`# Connectors

<!-- Generated from the connector registry (internal/connector) by ` + "`go generate ./internal/connector/all`" + `; do not edit. -->

A job file names a source or sink by its ` + "`type`" + `; the other fields of its mapping are the
connector's, below (docs/job-file.md has the rest of the file). Every source also takes the
event-time fields ` + "`watermark: {max_out_of_orderness, idle_timeout, interval}`" + ` and ` + "`watermark_lag`" + `;
those marked *timestamp* take ` + "`timestamp: {field: NAME}`" + ` too. Sinks marked *dead letters* may be a
wasm operator's ` + "`dead_letter`" + ` sink. ` + "`streamd validate`" + ` checks every field; the REST API lists the
same specs at ` + "`GET /connectors`" + `.

A connector is one Go file that registers itself (` + "`connector.RegisterSource`" + ` /
` + "`connector.RegisterSink`" + `, see the package doc of internal/connector).

`)
	for _, kind := range []struct {
		title string
		list  []*Plugin
	}{{"Sources", Sources()}, {"Sinks", Sinks()}} {
		fmt.Fprintf(&b, "## %s\n\n| type | |\n| --- | --- |\n", kind.title)
		for _, p := range kind.list {
			fmt.Fprintf(&b, "| [`%s`](#%s-%s) | %s |\n", p.Name, p.Kind, p.Name, cell(p.Spec.summary+marks(p)))
		}
		b.WriteString("\n")
		for _, p := range kind.list {
			writePlugin(&b, p)
		}
	}
	if ss := Settings(); len(ss) > 0 {
		b.WriteString("## Configuration keys\n\n| key | variable | flag | meaning |\n| --- | --- | --- | --- |\n")
		for _, s := range ss {
			flag := ""
			if s.Flag != "" {
				flag = "`--" + s.Flag + "`"
			}
			env := "STREAMD_" + strings.ToUpper(strings.ReplaceAll(s.Key, ".", "_"))
			fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s |\n", s.Key, env, flag, cell(s.Usage))
		}
		b.WriteString("\n")
	}
	schemes := append(InputUsages(), OutputUsages()...)
	if len(schemes) > 0 {
		fmt.Fprintf(&b, "## Transform schemes\n\n`streamd deploy MODULE.wasm --input` takes %s; `--output` takes %s.\n",
			"`"+strings.Join(InputUsages(), "`, `")+"`", "`"+strings.Join(OutputUsages(), "`, `")+"`")
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

func marks(p *Plugin) string {
	var m []string
	if p.Spec.timestamp {
		m = append(m, "timestamp")
	}
	if p.Spec.deadLetters {
		m = append(m, "dead letters")
	}
	if p.Spec.usesNATS {
		m = append(m, "NATS")
	}
	if len(m) == 0 {
		return ""
	}
	return " *" + strings.Join(m, ", ") + "*"
}

func writePlugin(b *bytes.Buffer, p *Plugin) {
	fmt.Fprintf(b, "<a id=\"%s-%s\"></a>\n### %s `%s`\n\n%s\n\n", p.Kind, p.Name, p.Kind, p.Name, p.Spec.summary)
	if p.Spec.description != "" {
		fmt.Fprintf(b, "%s\n\n", p.Spec.description)
	}
	if len(p.Spec.fields) == 0 {
		b.WriteString("No fields besides `type`.\n\n")
	} else {
		b.WriteString("| field | type | default | description |\n| --- | --- | --- | --- |\n")
		writeFields(b, p.Spec.fields, "")
		b.WriteString("\n")
	}
	if p.Spec.example != "" {
		fmt.Fprintf(b, "```yaml\n%s\n```\n\n", strings.TrimRight(p.Spec.example, "\n"))
	}
}

func writeFields(b *bytes.Buffer, fs []*Field, prefix string) {
	for _, f := range fs {
		def := ""
		switch {
		case f.Required:
			def = "required"
		case f.DefaultValue != nil:
			def = "`" + formatValue(f.DefaultValue) + "`"
		}
		doc := f.Doc
		if len(f.Enum) > 0 {
			doc += " One of " + "`" + strings.Join(f.Enum, "`, `") + "`."
		}
		for _, e := range f.Examples {
			doc += " Example: `" + formatValue(e) + "`."
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", prefix+f.Name, f.Type, def, cell(doc))
		if f.Type == TypeObject {
			writeFields(b, f.Fields, prefix+f.Name+".")
		}
	}
}

// cell escapes text for a Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// Info is a registered type as the REST API lists it (GET /connectors).
type Info struct {
	Type           string      `json:"type"`
	Summary        string      `json:"summary"`
	Description    string      `json:"description,omitempty"`
	Fields         []FieldInfo `json:"fields"`
	EventTimestamp bool        `json:"event_timestamp,omitempty"` // takes timestamp: {field}
	DeadLetters    bool        `json:"dead_letters,omitempty"`    // may be a dead_letter sink
	UsesNATS       bool        `json:"uses_nats,omitempty"`
	Example        string      `json:"example,omitempty"`
}

// FieldInfo is one field of an Info.
type FieldInfo struct {
	Name        string      `json:"name"`
	Type        string      `json:"type"`
	Description string      `json:"description"`
	Required    bool        `json:"required,omitempty"`
	Default     any         `json:"default,omitempty"`
	Enum        []string    `json:"enum,omitempty"`
	Examples    []any       `json:"examples,omitempty"`
	Fields      []FieldInfo `json:"fields,omitempty"`
}

// Catalog lists the registered sources and sinks as Sources and Sinks
// order them.
func Catalog() (sources, sinks []Info) {
	return infos(Sources()), infos(Sinks())
}

func infos(ps []*Plugin) []Info {
	out := make([]Info, 0, len(ps))
	for _, p := range ps {
		out = append(out, Info{Type: p.Name, Summary: p.Spec.summary, Description: p.Spec.description,
			Fields: fieldInfos(p.Spec.fields), EventTimestamp: p.Spec.timestamp, DeadLetters: p.Spec.deadLetters,
			UsesNATS: p.Spec.usesNATS, Example: p.Spec.example})
	}
	return out
}

func fieldInfos(fs []*Field) []FieldInfo {
	out := make([]FieldInfo, 0, len(fs))
	for _, f := range fs {
		def := f.DefaultValue
		if d, ok := def.(interface{ String() string }); ok {
			def = d.String() // a duration as 1ms, as a job file writes it
		}
		out = append(out, FieldInfo{Name: f.Name, Type: f.Type, Description: f.Doc, Required: f.Required,
			Default: def, Enum: f.Enum, Examples: f.Examples, Fields: fieldInfos(f.Fields)})
	}
	return out
}
