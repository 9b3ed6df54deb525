package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/runtime"
	"github.com/streamd/streamd/internal/telemetry"
)

// cli holds one invocation's streams, configuration and logger.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	v              *viper.Viper
	log            *slog.Logger
	configFile     string              // --config-file
	service        string              // the tracing service name of this process (startTelemetry)
	traces         *telemetry.Recorder // the checkpoint traces the web console shows (startTelemetry; nil on a host)
}

// usageError marks errors of the command line or configuration (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Configuration keys (docs/cli.md). Each also has a flag and a STREAMD_ variable.
const (
	keyLogLevel        = "log.level"
	keyLogFormat       = "log.format"
	keyWasmCacheDir    = "wasm.cache_dir"
	keyWasmMemoryLimit = "wasm.memory_limit_mib"
	keyWasmDeadline    = "wasm.call_deadline"
	keyBatchSize       = "runtime.batch_size"
	keyChannelCapacity = "runtime.channel_capacity"
	keyBufferTimeout   = "runtime.buffer_timeout"
	keyMaxRecordBytes  = "runtime.max_record_bytes"
	keyCheckpointMode  = "checkpoint.mode"
	keyAlignedTimeout  = "checkpoint.aligned_timeout"
	keyStateBackend    = "state.backend"
	keyStateCacheMiB   = "state.cache_mib"
	keyRunDataDir      = "runtime.data_dir"
	keyProgress        = "progress"
)

// configFileName is looked for in the current directory when --config-file is not given.
const configFileName = "streamd.yaml"

func newCLI(stdin io.Reader, stdout, stderr io.Writer) *cli {
	return &cli{stdin: stdin, stdout: stdout, stderr: stderr, v: viper.New()}
}

func (c *cli) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "streamd",
		Short: "streamd runs stream-processing jobs whose operators are WebAssembly modules",
		Long: `streamd runs stream-processing jobs whose operators are WebAssembly modules.

Settings come from flags, then STREAMD_* environment variables (STREAMD_LOG_LEVEL
for log.level), then a streamd.yaml file in the current directory (or the file
named by --config-file), then defaults. See docs/cli.md.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if fl := cmd.Flags().Lookup("parallelism"); fl != nil && fl.Changed {
				if n, err := cmd.Flags().GetInt("parallelism"); err == nil && n < 1 {
					return usagef("--parallelism must be at least 1, got %d", n)
				}
			}
			if cmd.Name() == cobra.ShellCompRequestCmd || cmd.Name() == cobra.ShellCompNoDescRequestCmd {
				// Its flags are not parsed yet (--config-file): job-id
				// completion loads the configuration (completionJobs), and
				// a bad one spoils no file completion.
				return nil
			}
			return c.loadConfig()
		},
	}
	root.SetIn(c.stdin)
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	pf := root.PersistentFlags()
	pf.StringVar(&c.configFile, "config-file", "", "streamd configuration file (default ./"+configFileName+" if it exists)")
	pf.String("log-level", "info", "log level: debug, info, warn or error ("+keyLogLevel+")")
	pf.String("log-format", "text", "log format: text or json ("+keyLogFormat+")")
	pf.String("wasm-cache-dir", "", `compiled-module cache directory; "off" disables it (`+keyWasmCacheDir+`; default: the user cache dir)`)
	pf.Int("wasm-memory-limit-mib", 256, "memory limit of each wasm instance in MiB ("+keyWasmMemoryLimit+")")
	pf.Duration("wasm-call-deadline", host.DefaultCallDeadline, "fail a guest call whose guest code runs longer than this, e.g. 10s; 0 = no deadline (a guest is still interruptible by cancel) ("+keyWasmDeadline+")")
	c.bind(pf, keyLogLevel, "log-level")
	c.bind(pf, keyLogFormat, "log-format")
	c.bind(pf, keyWasmCacheDir, "wasm-cache-dir")
	c.bind(pf, keyWasmMemoryLimit, "wasm-memory-limit-mib")
	c.bind(pf, keyWasmDeadline, "wasm-call-deadline")
	if err := telemetry.AddFlags(pf, c.v); err != nil {
		panic(err) // a programming error: a flag is missing
	}

	root.AddCommand(c.runCommand(), c.validateCommand(), c.versionCommand(), c.inspectCommand(), c.newCommand(), c.buildCommand(), c.benchCommand())
	root.AddCommand(c.clusterCommands()...)
	// The commands that complete no argument take none (list, hosts, server, ...).
	for _, cmd := range root.Commands() {
		if cmd.ValidArgsFunction == nil {
			cmd.ValidArgsFunction = cobra.NoFileCompletions
		}
	}
	if err := root.RegisterFlagCompletionFunc("config-file", func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return []cobra.Completion{"yaml", "yml"}, cobra.ShellCompDirectiveFilterFileExt
	}); err != nil {
		panic(err) // a programming error: the flag does not exist
	}
	return root
}

func (c *cli) bind(fs *pflag.FlagSet, key, flag string) {
	if err := c.v.BindPFlag(key, fs.Lookup(flag)); err != nil {
		panic(err) // a programming error: the flag does not exist
	}
}

// loadConfig reads the configuration file and environment and sets up logging.
func (c *cli) loadConfig() error {
	v := c.v
	v.SetDefault(keyLogLevel, "info")
	v.SetDefault(keyLogFormat, "text")
	v.SetDefault(keyWasmMemoryLimit, 256)
	v.SetDefault(keyWasmDeadline, host.DefaultCallDeadline.String())
	v.SetDefault(keyBatchSize, 1024)
	v.SetDefault(keyChannelCapacity, 16)
	v.SetDefault(keyBufferTimeout, runtime.DefaultBufferTimeout.String())
	v.SetDefault(keyProgress, "auto")
	v.SetEnvPrefix("STREAMD")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	// AutomaticEnv only answers keys viper knows; make sure every key is known.
	for _, k := range append([]string{keyWasmCacheDir, keyMaxRecordBytes, keyCheckpointMode, keyAlignedTimeout, keyStateBackend, keyStateCacheMiB, keyRunDataDir}, restartKeys...) {
		_ = v.BindEnv(k)
	}
	for _, k := range settingKeys() {
		_ = v.BindEnv(k)
	}

	file := c.configFile
	if file == "" {
		file = os.Getenv("STREAMD_CONFIG_FILE")
	}
	if file != "" {
		v.SetConfigFile(file)
		if err := v.ReadInConfig(); err != nil {
			return usagef("config file %s: %w", file, err)
		}
	} else if _, err := os.Stat(configFileName); err == nil {
		v.SetConfigFile(configFileName)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return usagef("config file %s: %w", configFileName, err)
		}
	}
	if err := c.checkKnownKeys(); err != nil {
		return err
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(v.GetString(keyLogLevel))); err != nil {
		return usagef("%s: %q is not a log level (want debug, info, warn or error)", keyLogLevel, v.GetString(keyLogLevel))
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f := v.GetString(keyLogFormat); f {
	case "text":
		c.log = slog.New(slog.NewTextHandler(c.stderr, opts))
	case "json":
		c.log = slog.New(slog.NewJSONHandler(c.stderr, opts))
	default:
		return usagef("%s: %q is not a log format (want text or json)", keyLogFormat, f)
	}
	return nil
}

// knownKeys are the keys a configuration file may set.
var knownKeys = []string{keyLogLevel, keyLogFormat, keyWasmCacheDir, keyWasmMemoryLimit, keyWasmDeadline, keyBatchSize, keyChannelCapacity, keyBufferTimeout, keyMaxRecordBytes, keyProgress, keyCheckpointMode, keyAlignedTimeout, keyStateBackend, keyStateCacheMiB, keyRunDataDir}

// checkKnownKeys rejects typos in the configuration file.
func (c *cli) checkKnownKeys() error {
	if c.v.ConfigFileUsed() == "" {
		return nil
	}
	keys := append(slices.Clone(knownKeys), settingKeys()...)
	for _, k := range c.v.AllKeys() {
		if !slices.Contains(keys, k) {
			return usagef("config file %s: unknown key %q (known: %s)", c.v.ConfigFileUsed(), k, strings.Join(keys, ", "))
		}
	}
	return nil
}

// engineOptions turns the wasm.* settings into host options.
func (c *cli) engineOptions() ([]host.Option, error) {
	opts := []host.Option{host.WithLogger(c.log)}
	switch dir := c.v.GetString(keyWasmCacheDir); dir {
	case "":
	case "off", "none":
		opts = append(opts, host.WithCacheDir(""))
	default:
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, usagef("%s: %w", keyWasmCacheDir, err)
		}
		opts = append(opts, host.WithCacheDir(abs))
	}
	mib, err := c.positiveInt(keyWasmMemoryLimit)
	if err != nil {
		return nil, err
	}
	opts = append(opts, host.WithMemoryLimitMiB(mib))
	d, err := c.duration(keyWasmDeadline)
	if err != nil {
		return nil, err
	}
	if d > 0 && d < host.MinCallDeadline {
		return nil, usagef("%s: %v is below %v, the least call deadline the guard can enforce (0: no deadline)", keyWasmDeadline, d, host.MinCallDeadline)
	}
	opts = append(opts, host.WithCallDeadline(d))
	return opts, nil
}

// maxRecordBytes is runtime.max_record_bytes, the max_record_bytes of jobs
// whose file sets none; 0 when the configuration does not set it (the
// default, abi.DefaultMaxRecordBytes, applies).
func (c *cli) maxRecordBytes() (int, error) {
	if !c.v.IsSet(keyMaxRecordBytes) {
		return 0, nil
	}
	raw := c.v.Get(keyMaxRecordBytes)
	n, err := castInt(raw)
	if err != nil {
		return 0, usagef("%s: want an integer number of bytes, got %v", keyMaxRecordBytes, raw)
	}
	if err := abi.CheckMaxRecordBytes(keyMaxRecordBytes, int64(n)); err != nil {
		return 0, usagef("%w", err)
	}
	return n, nil
}

// loadOptions are the job-file options the configuration gives: the
// restart strategy and max_record_bytes of job files that set none, and
// the parallelism override.
func (c *cli) loadOptions(parallelism int) (jobfile.Options, error) {
	restart, err := c.restartDefault()
	if err != nil {
		return jobfile.Options{}, err
	}
	mrb, err := c.maxRecordBytes()
	if err != nil {
		return jobfile.Options{}, err
	}
	o := jobfile.Options{Parallelism: parallelism, Restart: restart, MaxRecordBytes: mrb}
	if o.CheckpointMode, o.AlignedTimeout, err = c.checkpointMode(); err != nil {
		return jobfile.Options{}, err
	}
	if o.StateBackend, o.StateCacheMiB, err = c.stateDefault(); err != nil {
		return jobfile.Options{}, err
	}
	return o, nil
}

// stateDefault is state.backend and state.cache_mib, the state of job
// files without a state section ("" and 0 when the configuration does not
// say).
func (c *cli) stateDefault() (string, int, error) {
	backend, mib := "", 0
	if c.v.IsSet(keyStateBackend) {
		backend = c.v.GetString(keyStateBackend)
	}
	if c.v.IsSet(keyStateCacheMiB) {
		raw := c.v.Get(keyStateCacheMiB)
		n, err := castInt(raw)
		if err != nil {
			return "", 0, usagef("%s: want an integer number of MiB, got %v", keyStateCacheMiB, raw)
		}
		if n < 1 {
			return "", 0, usagef("%s: must be at least 1, got %d", keyStateCacheMiB, n)
		}
		mib = n
	}
	if backend != "" || mib != 0 {
		if err := jobfile.CheckState(cmp.Or(backend, jobfile.StateMemory), mib); err != nil {
			return "", 0, usagef("%w", err)
		}
	}
	return backend, mib, nil
}

// checkpointMode is checkpoint.mode and checkpoint.aligned_timeout, the
// mode of job files whose checkpoint section sets neither ("" and 0 when
// the configuration does not say).
func (c *cli) checkpointMode() (string, time.Duration, error) {
	var mode string
	var timeout time.Duration
	if c.v.IsSet(keyCheckpointMode) {
		mode = c.v.GetString(keyCheckpointMode)
		if mode != jobfile.ModeAligned && mode != jobfile.ModeUnaligned {
			return "", 0, usagef("%s: %q: want aligned or unaligned", keyCheckpointMode, mode)
		}
	}
	if c.v.IsSet(keyAlignedTimeout) {
		d, err := c.duration(keyAlignedTimeout)
		if err != nil {
			return "", 0, err
		}
		if d < 0 {
			return "", 0, usagef("%s: must not be negative, got %v", keyAlignedTimeout, d)
		}
		if d > 0 && mode == jobfile.ModeUnaligned {
			return "", 0, usagef("%s: only with %s: aligned (with unaligned every checkpoint is unaligned from its first barrier)", keyAlignedTimeout, keyCheckpointMode)
		}
		timeout = d
	}
	return mode, timeout, nil
}

func (c *cli) positiveInt(key string) (int, error) {
	raw := c.v.Get(key)
	n, err := castInt(raw)
	if err != nil || n < 1 {
		return 0, usagef("%s: want a positive integer, got %v", key, raw)
	}
	return n, nil
}

func castInt(x any) (int, error) {
	switch x := x.(type) {
	case int:
		return x, nil
	case int64:
		return int(x), nil
	case float64:
		if x == float64(int(x)) {
			return int(x), nil
		}
	case string:
		var n int
		if _, err := fmt.Sscanf(x, "%d", &n); err == nil && fmt.Sprint(n) == strings.TrimSpace(x) {
			return n, nil
		}
	}
	return 0, errors.New("not an integer")
}

func (c *cli) duration(key string) (time.Duration, error) {
	raw := c.v.Get(key)
	switch x := raw.(type) {
	case time.Duration:
		return x, nil
	case int:
		if x == 0 {
			return 0, nil
		}
	case string:
		if d, err := time.ParseDuration(x); err == nil && d >= 0 {
			return d, nil
		}
		if x == "0" {
			return 0, nil
		}
	}
	return 0, usagef("%s: want a duration like 10s, got %v", key, raw)
}

// bufferTimeoutFlag declares --buffer-timeout (run, host, server).
func bufferTimeoutFlag(fl *pflag.FlagSet) {
	fl.Duration("buffer-timeout", runtime.DefaultBufferTimeout, "longest a busy subtask holds records in an output batch that is not full, e.g. 2ms; 0 = until the batch is full or the subtask idles ("+keyBufferTimeout+")")
}

// bufferTimeout is runtime.buffer_timeout as runtime.Options takes it: 0
// (no deadline) becomes negative, since 0 there means the default.
func (c *cli) bufferTimeout() (time.Duration, error) {
	d, err := c.duration(keyBufferTimeout)
	if err != nil || d > 0 {
		return d, err
	}
	return -1, nil
}

// execute runs the command line and prints errors as "streamd: <reason>".
func (c *cli) execute(ctx context.Context, args []string) int {
	root := c.rootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, errStopped) {
		return exitCanceled
	}
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		fmt.Fprintln(c.stderr, "streamd: canceled")
		return exitCanceled
	}
	// Errors of the host already start with "streamd: "; do not say it twice.
	fmt.Fprintf(c.stderr, "streamd: %s\n", strings.TrimPrefix(err.Error(), "streamd: "))
	var ue usageError
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") {
		return exitUsage
	}
	return exitFailed
}

// exactArgs is cobra.ExactArgs with a usage error and the command's use line.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s: want %d argument(s), got %d (usage: %s)", cmd.Name(), n, len(args), cmd.UseLine())
		}
		return nil
	}
}
