package natsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

func start(t *testing.T, o EmbeddedOptions) *Server {
	t.Helper()
	o.Port, o.NoLog = -1, true
	s, err := StartEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// roundTrip checks a connection can publish and receive.
func roundTrip(t *testing.T, nc *nats.Conn) {
	t.Helper()
	sub, err := nc.SubscribeSync("natsutil.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("natsutil.test", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(m.Data) != "hi" {
		t.Fatalf("round trip: %v %v", m, err)
	}
}

func TestEmbeddedJetStream(t *testing.T) {
	s := start(t, EmbeddedOptions{})
	dir := s.tmpDir
	if dir == "" {
		t.Fatal("no temporary store directory")
	}
	if !strings.HasPrefix(s.URL(), "nats://127.0.0.1:") || strings.HasSuffix(s.URL(), ":4222") {
		t.Errorf("URL %s: want a random port on 127.0.0.1", s.URL())
	}
	nc, err := Connect(URLs(s.URL()), Name("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	roundTrip(t, nc)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatalf("JetStream not enabled: %v", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("store directory %s left behind: %v", dir, err)
	}
}

func TestEmbeddedStoreDirKept(t *testing.T) {
	dir := t.TempDir()
	s := start(t, EmbeddedOptions{StoreDir: dir})
	s.Shutdown()
	if _, err := os.Stat(filepath.Join(dir, "jetstream")); err != nil {
		t.Errorf("the given store directory is not used or was removed: %v", err)
	}
}

func TestUserPasswordAndToken(t *testing.T) {
	s := start(t, EmbeddedOptions{Username: "u", Password: "p"})
	nc, err := Connect(URLs(s.URL()), UserPassword("u", "p"))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, nc)
	nc.Close()
	if _, err := Connect(URLs(s.URL()), UserPassword("u", "wrong")); err == nil || !strings.Contains(err.Error(), "natsutil: connect to "+s.URL()) {
		t.Errorf("wrong password: %v", err)
	}

	s2 := start(t, EmbeddedOptions{Token: "secret"})
	nc, err = Connect(URLs(s2.URL()), Token("secret"))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, nc)
	nc.Close()
	if _, err := Connect(URLs(s2.URL())); err == nil {
		t.Error("connected without the token")
	}
}

func TestNKeySeedFile(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	os.WriteFile(seedFile, seed, 0o600)
	s := start(t, EmbeddedOptions{Configure: func(o *server.Options) {
		o.Nkeys = []*server.NkeyUser{{Nkey: pub}}
	}})
	nc, err := Connect(URLs(s.URL()), NKeySeedFile(seedFile))
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, nc)
	nc.Close()

	bad := filepath.Join(t.TempDir(), "bad.nk")
	os.WriteFile(bad, []byte("not a seed"), 0o600)
	if _, err := Connect(URLs(s.URL()), NKeySeedFile(bad)); err == nil || !strings.Contains(err.Error(), "natsutil: nkey seed file "+bad) {
		t.Errorf("bad seed: %v", err)
	}
}

// writeCert writes a PEM certificate and key signed by parent (self-signed
// when parent is nil) and returns them.
func writeCert(t *testing.T, dir, name string, isCA bool, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	if isCA {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return cert, key, certFile, keyFile
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey, caFile, _ := writeCert(t, dir, "ca", true, nil, nil)
	_, _, srvCert, srvKey := writeCert(t, dir, "server", false, ca, caKey)
	_, _, cliCert, cliKey := writeCert(t, dir, "client", false, ca, caKey)
	pair, err := tls.LoadX509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	s := start(t, EmbeddedOptions{Configure: func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSTimeout = true, true, 5
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	}})
	nc, err := Connect(URLs(s.URL()), TLS(caFile, cliCert, cliKey))
	if err != nil {
		t.Fatal(err)
	}
	if !nc.TLSRequired() {
		t.Error("connection is not TLS")
	}
	roundTrip(t, nc)
	nc.Close()
	if _, err := Connect(URLs(s.URL()), TLS(caFile, "", "")); err == nil {
		t.Error("connected without a client certificate")
	}
}

func TestConnectOptionsValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, []byte("x"), 0o600)
	for _, c := range []struct {
		name string
		opts []Option
		want string
	}{
		{"http url", []Option{URLs("http://x:4222")}, `scheme "http"`},
		{"no host", []Option{URLs("nats://")}, "no host"},
		{"empty url in list", []Option{URLs("nats://a:1,,nats://b:2")}, "empty server URL"},
		{"empty user", []Option{UserPassword("", "p")}, "empty user"},
		{"two methods", []Option{UserPassword("u", "p"), Token("t")}, "more than one authentication method set (user/password, token)"},
		{"creds and nkey", []Option{CredsFile(file), NKeySeedFile(file)}, "(nkey seed file, creds file)"},
		{"missing creds", []Option{CredsFile(filepath.Join(dir, "nope.creds"))}, "creds file: stat"},
		{"creds is dir", []Option{CredsFile(dir)}, "is a directory"},
		{"cert without key", []Option{TLS("", file, "")}, "set both or neither"},
		{"missing ca", []Option{TLS(filepath.Join(dir, "ca.pem"), "", "")}, "TLS CA file"},
	} {
		_, err := NewConnectOptions(c.opts...)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "natsutil: ") {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// The struct filled from configuration validates the same way.
	if err := (ConnectOptions{Password: "p"}).Validate(); err == nil || !strings.Contains(err.Error(), "password set without a user") {
		t.Errorf("password without user: %v", err)
	}
	o, err := NewConnectOptions(URLs("nats://a:1, tls://b:2", "nats://c:3"), Name("n"))
	if err != nil {
		t.Fatal(err)
	}
	if o.URL() != "nats://a:1,tls://b:2,nats://c:3" {
		t.Errorf("URL %q", o.URL())
	}
	if (ConnectOptions{}).URL() != nats.DefaultURL {
		t.Error("no default URL")
	}
}

func TestEmbeddedOptionsValidate(t *testing.T) {
	if _, err := StartEmbedded(EmbeddedOptions{Port: -1, NoLog: true, Password: "p"}); err == nil {
		t.Error("password without username accepted")
	}
	if _, err := StartEmbedded(EmbeddedOptions{Port: -1, NoLog: true, Token: "t", Username: "u"}); err == nil {
		t.Error("token and username accepted")
	}
}

// TestKeepReconnecting: a connection with KeepReconnecting rejoins a server
// restarted on the same port (and keeps its subscriptions), and never gives
// up reconnecting.
func TestKeepReconnecting(t *testing.T) {
	o := nats.GetDefaultOptions()
	for _, opt := range KeepReconnecting() {
		if err := opt(&o); err != nil {
			t.Fatal(err)
		}
	}
	if o.MaxReconnect != -1 || o.ReconnectWait != DefaultReconnectWait {
		t.Fatalf("MaxReconnect %d ReconnectWait %s, want -1 and %s", o.MaxReconnect, o.ReconnectWait, DefaultReconnectWait)
	}
	srv, err := StartEmbedded(EmbeddedOptions{Port: -1, NoLog: true, NoJetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Addr().(*net.TCPAddr).Port
	reconnected, failed := make(chan struct{}, 1), make(chan struct{}, 16)
	co := ConnectOptions{URLs: []string{srv.URL()}}
	nc, err := co.Connect(append(KeepReconnecting(),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }),
		nats.ReconnectErrHandler(func(*nats.Conn, error) {
			select {
			case failed <- struct{}{}:
			default:
			}
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	for i := 0; i < 3; i++ { // several reconnect attempts fail
		select {
		case <-failed:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d failed reconnect attempts in 30s, want 3", i)
		}
	}
	srv, err = StartEmbedded(EmbeddedOptions{Port: port, NoLog: true, NoJetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	select {
	case <-reconnected:
	case <-time.After(30 * time.Second):
		t.Fatalf("not reconnected 30s after the restart (status %v)", nc.Status())
	}
	if err := nc.Publish("x", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(2 * time.Second); err != nil || string(m.Data) != "hi" {
		t.Fatalf("after the restart: %v %v", m, err)
	}
}
