// Package scripttest runs data-driven test scripts, as etcd's raft does its
// interaction tests: each testdata/*.txt script is a series of cases, each
// one or more input lines, a line "----", and the expected output up to the
// next blank line. Lines starting with '#' and blank lines between cases
// are comments. With rewrite the expected outputs are written anew, to be
// read in the diff.
package scripttest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Case is one case of a script.
type Case struct {
	Pre    []string // the comments and blank lines before it
	Input  []string
	Output []string
}

// Parse reads the cases of a script, and the comments after the last one.
func Parse(t testing.TB, text string) (cases []Case, trailer []string) {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	var pre []string
	for i := 0; i < len(lines); {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			pre = append(pre, l)
			i++
			continue
		}
		c := Case{Pre: pre}
		pre = nil
		for ; i < len(lines) && lines[i] != "----"; i++ {
			c.Input = append(c.Input, lines[i])
		}
		if i == len(lines) {
			t.Fatalf("case %q: missing ----", c.Input[0])
		}
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			c.Output = append(c.Output, lines[i])
		}
		cases = append(cases, c)
	}
	return cases, pre
}

// Run runs every script that glob matches, each as a subtest with a runner
// of its own from newRunner: the runner gets each case's input lines and
// returns its output ("ok" stands for none).
func Run(t *testing.T, glob string, rewrite bool, newRunner func(t *testing.T) func(input []string) []string) {
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts match %s: %v", glob, err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			runFile(t, file, string(data), rewrite, newRunner(t))
		})
	}
}

// runFile runs the cases of one script and compares (or, with rewrite,
// rewrites) their outputs.
func runFile(t *testing.T, file, data string, rewrite bool, run func([]string) []string) {
	cases, trailer := Parse(t, data)
	var out strings.Builder
	for _, c := range cases {
		got := run(c.Input)
		if len(got) == 0 {
			got = []string{"ok"}
		}
		if !rewrite && !slices.Equal(got, c.Output) {
			t.Errorf("%s: %s\n--- want\n%s\n--- got\n%s", file, strings.Join(c.Input, "\n"),
				strings.Join(c.Output, "\n"), strings.Join(got, "\n"))
		}
		for _, l := range c.Pre {
			out.WriteString(l + "\n")
		}
		out.WriteString(strings.Join(c.Input, "\n") + "\n----\n" + strings.Join(got, "\n") + "\n")
	}
	for _, l := range trailer {
		out.WriteString(l + "\n")
	}
	if rewrite {
		if err := os.WriteFile(file, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
