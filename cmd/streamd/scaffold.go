package main

import (
	"bufio"
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"text/template"

	"github.com/spf13/cobra"

	streamd "github.com/streamd/streamd/sdk/go"
	rustsdk "github.com/streamd/streamd/sdk/rust"
)

// The project templates of streamd new: templates/common for every language,
// templates/LANG on top. A file's ".tmpl" suffix is dropped after it is
// expanded with a projectData; a leading "dot-" in a path element becomes
// "." (dotfiles are not embedded as such).
//
//go:embed templates
var templates embed.FS

// sdkGoModule is the Go SDK's module path.
const sdkGoModule = "github.com/streamd/streamd/sdk/go"

// The directories of a project that hold the SDK copies streamd new writes.
const (
	sdkGoDir   = ".streamd/sdk-go"
	sdkRustDir = ".streamd/sdk-rust"
)

// projectData is what the templates see.
type projectData struct {
	Name      string // the project's name: the last element of NAME
	Module    string // Go: the module path
	Wasm      string // the module file job.yaml names, relative to it
	Version   string // streamd's version
	GoVersion string // Go: the go line of the SDK's go.mod
	SDKModule string // Go: the SDK's module path
	SDKDir    string // the SDK copy, relative to the project
}

var projectNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// rustReserved are names a Cargo package cannot take: Rust keywords, the
// crates of the standard library, and the SDK's own name.
var rustReserved = []string{
	"streamd", "std", "core", "alloc", "proc_macro", "test",
	"as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern",
	"false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
	"ref", "return", "self", "static", "struct", "super", "trait", "true", "type", "unsafe", "use",
	"where", "while", "abstract", "become", "box", "do", "final", "macro", "override", "priv",
	"typeof", "unsized", "virtual", "yield", "try",
}

func checkProjectName(lang, name string) error {
	if !projectNameRE.MatchString(name) {
		return usagef("project name %q: want a letter, then letters, digits, '-' or '_' (at most 64 characters)", name)
	}
	if lang == "rust" && slices.Contains(rustReserved, strings.ReplaceAll(name, "-", "_")) {
		return usagef("project name %q: a Rust crate cannot be named so (a keyword, a standard crate or the SDK's crate streamd)", name)
	}
	return nil
}

var moduleElemRE = regexp.MustCompile(`^[A-Za-z0-9._~-]+$`)

// checkModulePath checks a Go module path the way go mod init would refuse
// the obvious mistakes: slash-separated elements of letters, digits and
// "-._~", none empty, none starting or ending with a dot.
func checkModulePath(p string) error {
	if p == "" {
		return usagef("--module: empty module path")
	}
	for _, e := range strings.Split(p, "/") {
		if !moduleElemRE.MatchString(e) || strings.HasPrefix(e, ".") || strings.HasSuffix(e, ".") {
			return usagef("--module %q: not a Go module path (slash-separated elements of letters, digits and '-', '.', '_', '~')", p)
		}
	}
	return nil
}

func (c *cli) newCommand() *cobra.Command {
	var module string
	var force bool
	cmd := &cobra.Command{
		Use:   "new go|rust NAME [--module PATH] [--force]",
		Short: "Create an operator project (Go or Rust) with a job file, ready for streamd build",
		Long: `Create the directory NAME with an operator project in Go or Rust: the operator
(it upper-cases each record's value), a unit test (go test / cargo test), a
job.yaml that runs it on input.txt into out/, and a copy of the SDK that this
streamd ships with (in NAME/.streamd/), which the project uses through a go.mod
replace or a Cargo path dependency, so that it builds without any download:

  streamd new go myop && streamd build myop && streamd run myop/job.yaml

NAME may be a path; its last element names the project (the job, the module
file NAME.wasm, the Cargo package, and the Go module unless --module says
otherwise) and must be a letter followed by letters, digits, '-' or '_'. An
existing directory must be empty, unless --force: then the project's files
replace those of the same names in it (and its .streamd/ SDK copy), and other
files stay.`,
		Example: `  streamd new go myop
  streamd new go myop --module example.com/team/myop
  streamd new rust myfilter`,
		Args: exactArgs(2),
		ValidArgsFunction: func(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) == 0 {
				return []cobra.Completion{"go", "rust"}, cobra.ShellCompDirectiveNoFileComp
			}
			return nil, cobra.ShellCompDirectiveFilterDirs
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			lang, dir := args[0], args[1]
			if lang != "go" && lang != "rust" {
				return usagef("new: unknown language %q (want go or rust)", lang)
			}
			if cmd.Flags().Changed("module") && lang != "go" {
				return usagef("new: --module applies only to a Go project")
			}
			files, data, err := projectFiles(lang, filepath.Base(filepath.Clean(dir)), module)
			if err != nil {
				return err
			}
			if err := writeProject(dir, files, data.SDKDir, force); err != nil {
				return err
			}
			what := "Go operator project " + data.Name + " (module " + data.Module + ")"
			if lang == "rust" {
				what = "Rust operator project " + data.Name
			}
			fmt.Fprintf(c.stdout, "created %s in %s\nnext: streamd build %s && streamd run %s\n",
				what, dir, dir, filepath.Join(dir, "job.yaml"))
			return nil
		},
	}
	cmd.Flags().StringVar(&module, "module", "", "the Go module path (default: the project name)")
	cmd.Flags().BoolVar(&force, "force", false, "write into an existing non-empty directory, replacing files of the same names")
	return cmd
}

// projectFiles returns the files of a new project, by slash path relative to
// its directory: the expanded templates and the SDK copy.
func projectFiles(lang, name, module string) (map[string][]byte, projectData, error) {
	if err := checkProjectName(lang, name); err != nil {
		return nil, projectData{}, err
	}
	data := projectData{Name: name, Wasm: name + ".wasm", Version: buildVersion()}
	files := map[string][]byte{}
	var sdk fs.FS
	switch lang {
	case "go":
		if module == "" {
			module = name
		}
		if err := checkModulePath(module); err != nil {
			return nil, data, err
		}
		data.Module, data.SDKModule, data.SDKDir = module, sdkGoModule, sdkGoDir
		sdk = streamd.SDKFiles
		gomod, err := fs.ReadFile(sdk, "go.mod")
		if err != nil {
			return nil, data, fmt.Errorf("new: the embedded Go SDK: %w", err)
		}
		if data.GoVersion = goLine(gomod); data.GoVersion == "" {
			return nil, data, errors.New("new: the embedded Go SDK's go.mod has no go line")
		}
	case "rust":
		data.SDKDir = sdkRustDir
		sdk = rustsdk.Files
		lock, err := cargoLock(name)
		if err != nil {
			return nil, data, err
		}
		files["Cargo.lock"] = lock
	}
	for _, root := range []string{"templates/common", "templates/" + lang} {
		err := fs.WalkDir(templates, root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(templates, p)
			if err != nil {
				return err
			}
			rel := strings.TrimPrefix(p, root+"/")
			if strings.HasSuffix(rel, ".tmpl") {
				t, err := template.New(rel).Option("missingkey=error").Parse(string(b))
				if err != nil {
					return err
				}
				var out bytes.Buffer
				if err := t.Execute(&out, data); err != nil {
					return err
				}
				b, rel = out.Bytes(), strings.TrimSuffix(rel, ".tmpl")
			}
			elems := strings.Split(rel, "/")
			for i, e := range elems {
				if rest, ok := strings.CutPrefix(e, "dot-"); ok {
					elems[i] = "." + rest
				}
			}
			files[strings.Join(elems, "/")] = b
			return nil
		})
		if err != nil {
			return nil, data, fmt.Errorf("new: templates: %w", err)
		}
	}
	err := fs.WalkDir(sdk, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sdk, p)
		files[path.Join(data.SDKDir, p)] = b
		return err
	})
	if err != nil {
		return nil, data, fmt.Errorf("new: the embedded SDK: %w", err)
	}
	return files, data, nil
}

// cargoLock is the new Rust project's Cargo.lock: the project and the SDK
// copy, in lock-file version 3, which Debian's cargo (1.65) reads and a
// newer cargo (which writes version 4 for a project without a lock file)
// keeps, so `cargo test` with either toolchain and `streamd build` work on
// one project.
func cargoLock(name string) ([]byte, error) {
	toml, err := fs.ReadFile(rustsdk.Files, "Cargo.toml")
	if err != nil {
		return nil, fmt.Errorf("new: the embedded Rust SDK: %w", err)
	}
	m := regexp.MustCompile(`(?m)^version = "([^"]+)"`).FindSubmatch(toml)
	if m == nil {
		return nil, errors.New("new: the embedded Rust SDK's Cargo.toml has no version")
	}
	pkgs := []string{
		fmt.Sprintf("[[package]]\nname = %q\nversion = \"0.1.0\"\ndependencies = [\n \"streamd\",\n]\n", name),
		fmt.Sprintf("[[package]]\nname = \"streamd\"\nversion = %q\n", m[1]),
	}
	if name > "streamd" { // cargo sorts packages by name
		pkgs[0], pkgs[1] = pkgs[1], pkgs[0]
	}
	return []byte("# This file is automatically @generated by Cargo.\n# It is not intended for manual editing.\nversion = 3\n\n" + strings.Join(pkgs, "\n")), nil
}

// goLine returns the version of a go.mod's go directive.
func goLine(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "go" {
			return f[1]
		}
	}
	return ""
}

// writeProject writes files into dir, which must not exist or be empty
// unless force. With force the SDK copy sdkDir is replaced as a whole, so no
// file of an older SDK stays behind.
func writeProject(dir string, files map[string][]byte, sdkDir string, force bool) error {
	switch entries, err := os.ReadDir(dir); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		if fi, serr := os.Stat(dir); serr == nil && !fi.IsDir() {
			return fmt.Errorf("new: %s exists and is not a directory; nothing written", dir)
		}
		return fmt.Errorf("new: %w", err)
	case len(entries) > 0 && !force:
		return fmt.Errorf("new: directory %s is not empty; nothing written (--force writes the project into it, replacing files of the same names)", dir)
	case len(entries) > 0:
		if err := os.RemoveAll(filepath.Join(dir, filepath.FromSlash(sdkDir))); err != nil {
			return fmt.Errorf("new: %w", err)
		}
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("new: %w", err)
		}
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			return fmt.Errorf("new: %w", err)
		}
	}
	return nil
}
