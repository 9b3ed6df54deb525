package natsutil

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// ConnectOptions says how to reach and authenticate to NATS. At most one
// authentication method is set: User/Password, Token, NKeySeedFile or
// CredsFile. Build it from configuration (the mapstructure tags match
// streamd's config keys) or with NewConnectOptions and the Option functions,
// which validate as they go.
type ConnectOptions struct {
	URLs         []string `mapstructure:"urls" yaml:"urls"`                     // default nats://127.0.0.1:4222
	User         string   `mapstructure:"user" yaml:"user"`                     // with Password
	Password     string   `mapstructure:"password" yaml:"password"`             //
	Token        string   `mapstructure:"token" yaml:"token"`                   //
	NKeySeedFile string   `mapstructure:"nkey_seed_file" yaml:"nkey_seed_file"` // a file holding a user nkey seed (SU...)
	CredsFile    string   `mapstructure:"creds_file" yaml:"creds_file"`         // a .creds file: user JWT and nkey seed
	TLSCAFile    string   `mapstructure:"tls_ca_file" yaml:"tls_ca_file"`       // PEM roots to verify the server with
	TLSCertFile  string   `mapstructure:"tls_cert_file" yaml:"tls_cert_file"`   // client certificate (mutual TLS), with TLSKeyFile
	TLSKeyFile   string   `mapstructure:"tls_key_file" yaml:"tls_key_file"`     //
	Name         string   `mapstructure:"name" yaml:"name"`                     // connection name shown by the server, e.g. "streamd host h1"
}

// Option sets one field of ConnectOptions and validates it.
type Option func(*ConnectOptions) error

// URLs adds server URLs; each may itself be a comma-separated list.
func URLs(urls ...string) Option {
	return func(o *ConnectOptions) error {
		for _, u := range urls {
			for _, p := range strings.Split(u, ",") {
				p = strings.TrimSpace(p)
				if err := checkURL(p); err != nil {
					return err
				}
				o.URLs = append(o.URLs, p)
			}
		}
		return nil
	}
}

// UserPassword authenticates with a user name and password.
func UserPassword(user, password string) Option {
	return func(o *ConnectOptions) error {
		if user == "" {
			return errors.New("natsutil: user/password: empty user")
		}
		o.User, o.Password = user, password
		return nil
	}
}

// Token authenticates with a token.
func Token(token string) Option {
	return func(o *ConnectOptions) error {
		if token == "" {
			return errors.New("natsutil: token: empty token")
		}
		o.Token = token
		return nil
	}
}

// NKeySeedFile authenticates with the user nkey whose seed is in path.
func NKeySeedFile(path string) Option {
	return func(o *ConnectOptions) error {
		if err := checkFile("nkey seed file", path); err != nil {
			return err
		}
		o.NKeySeedFile = path
		return nil
	}
}

// CredsFile authenticates with a .creds file (user JWT and nkey seed).
func CredsFile(path string) Option {
	return func(o *ConnectOptions) error {
		if err := checkFile("creds file", path); err != nil {
			return err
		}
		o.CredsFile = path
		return nil
	}
}

// TLS verifies the server with the PEM roots in caFile (empty: the system
// roots) and, when certFile and keyFile are set, presents that client
// certificate.
func TLS(caFile, certFile, keyFile string) Option {
	return func(o *ConnectOptions) error {
		o.TLSCAFile, o.TLSCertFile, o.TLSKeyFile = caFile, certFile, keyFile
		return o.checkTLS()
	}
}

// Name names the connection (shown by the server's monitoring).
func Name(name string) Option {
	return func(o *ConnectOptions) error {
		o.Name = name
		return nil
	}
}

// NewConnectOptions applies opts and validates the result.
func NewConnectOptions(opts ...Option) (ConnectOptions, error) {
	var o ConnectOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return ConnectOptions{}, err
		}
	}
	return o, o.Validate()
}

// Validate checks the URLs, that at most one authentication method is set,
// that the files named exist, and that a TLS certificate comes with its key.
func (o ConnectOptions) Validate() error {
	for _, u := range o.URLs {
		if err := checkURL(u); err != nil {
			return err
		}
	}
	var methods []string
	if o.User != "" || o.Password != "" {
		if o.User == "" {
			return errors.New("natsutil: password set without a user")
		}
		methods = append(methods, "user/password")
	}
	if o.Token != "" {
		methods = append(methods, "token")
	}
	if o.NKeySeedFile != "" {
		if err := checkFile("nkey seed file", o.NKeySeedFile); err != nil {
			return err
		}
		methods = append(methods, "nkey seed file")
	}
	if o.CredsFile != "" {
		if err := checkFile("creds file", o.CredsFile); err != nil {
			return err
		}
		methods = append(methods, "creds file")
	}
	if len(methods) > 1 {
		return fmt.Errorf("natsutil: more than one authentication method set (%s); choose one", strings.Join(methods, ", "))
	}
	return o.checkTLS()
}

func (o ConnectOptions) checkTLS() error {
	if (o.TLSCertFile == "") != (o.TLSKeyFile == "") {
		return fmt.Errorf("natsutil: TLS client certificate %q and key %q: set both or neither", o.TLSCertFile, o.TLSKeyFile)
	}
	for _, f := range []struct{ what, path string }{
		{"TLS CA file", o.TLSCAFile}, {"TLS certificate file", o.TLSCertFile}, {"TLS key file", o.TLSKeyFile},
	} {
		if f.path != "" {
			if err := checkFile(f.what, f.path); err != nil {
				return err
			}
		}
	}
	return nil
}

// TLSEnabled reports whether any TLS file is set.
func (o ConnectOptions) TLSEnabled() bool {
	return o.TLSCAFile != "" || o.TLSCertFile != ""
}

// URL is the comma-separated server list nats.Connect takes.
func (o ConnectOptions) URL() string {
	if len(o.URLs) == 0 {
		return nats.DefaultURL
	}
	return strings.Join(o.URLs, ",")
}

// NATSOptions validates o and returns the nats.go options it stands for
// (everything but the URL, see URL). Reading the nkey seed happens here.
func (o ConnectOptions) NATSOptions() ([]nats.Option, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	if o.Name != "" {
		opts = append(opts, nats.Name(o.Name))
	}
	switch {
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	case o.Token != "":
		opts = append(opts, nats.Token(o.Token))
	case o.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("natsutil: nkey seed file %s: %w", o.NKeySeedFile, err)
		}
		opts = append(opts, opt)
	case o.CredsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(o.TLSCAFile))
	}
	if o.TLSCertFile != "" {
		opts = append(opts, nats.ClientCert(o.TLSCertFile, o.TLSKeyFile))
	}
	return opts, nil
}

// Connect validates o and connects; extra options (handlers, reconnect
// policy) are applied after o's.
func (o ConnectOptions) Connect(extra ...nats.Option) (*nats.Conn, error) {
	opts, err := o.NATSOptions()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(o.URL(), append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("natsutil: connect to %s: %w", o.URL(), err)
	}
	return nc, nil
}

// Connect builds ConnectOptions from opts and connects.
func Connect(opts ...Option) (*nats.Conn, error) {
	o, err := NewConnectOptions(opts...)
	if err != nil {
		return nil, err
	}
	return o.Connect()
}

func checkURL(s string) error {
	if s == "" {
		return errors.New("natsutil: empty server URL")
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("natsutil: server URL %q: %w", s, err)
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Errorf("natsutil: server URL %q: scheme %q, want nats://, tls://, ws:// or wss://", s, u.Scheme)
	}
	if u.Host == "" {
		return fmt.Errorf("natsutil: server URL %q: no host", s)
	}
	return nil
}

func checkFile(what, path string) error {
	if path == "" {
		return fmt.Errorf("natsutil: %s: empty path", what)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("natsutil: %s: %w", what, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("natsutil: %s %s is a directory", what, path)
	}
	return nil
}

// DefaultReconnectWait is the pause between reconnect attempts of
// KeepReconnecting.
const DefaultReconnectWait = 250 * time.Millisecond

// KeepReconnecting are the reconnect options of long-lived processes (the
// controller, hosts, `streamd server`): reconnect forever, every
// DefaultReconnectWait plus a little jitter, so a NATS server that restarts
// or is away for a while is rejoined however long it takes. nats.go
// resubscribes on reconnect and buffers what is published meanwhile (up to
// its reconnect buffer); what is lost on data channels is caught by their
// sequence numbers. Without these options nats.go gives up after 60 tries
// 2 s apart and closes the connection for good.
func KeepReconnecting() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(DefaultReconnectWait),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
	}
}

// WaitConnected waits until nc is connected, or ctx ends, or nc is closed.
// A JetStream listing or watch (an ordered consumer) begun while the
// connection is down stalls for good in the client, so they wait first.
func WaitConnected(ctx context.Context, nc *nats.Conn) error {
	for !nc.IsConnected() {
		if nc.IsClosed() {
			return nats.ErrConnectionClosed
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsutil: waiting for the NATS connection to %s: %w", nc.ConnectedUrlRedacted(), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}
