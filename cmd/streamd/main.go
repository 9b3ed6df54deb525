// Command streamd runs stream-processing jobs whose operators are WebAssembly
// modules. See docs/cli.md.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	_ "github.com/streamd/streamd/internal/connector/all" // the connectors in packages of their own (kafka)
)

func main() {
	os.Exit(Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK       = 0
	exitFailed   = 1   // the job failed, the job file or module is invalid, or an IO error
	exitUsage    = 2   // bad command line or configuration
	exitCanceled = 130 // interrupted (Ctrl-C, SIGTERM)
)

// Main runs the CLI with args (without the program name) and returns the exit
// status. SIGINT and SIGTERM cancel ctx: the job is stopped cleanly and Main
// returns exitCanceled. A second signal kills the process.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // restore the default handlers: a second Ctrl-C kills at once
	}()
	cli := newCLI(stdin, stdout, stderr)
	return cli.execute(ctx, args)
}
