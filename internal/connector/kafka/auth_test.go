package kafka

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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/connector/kafka/kafkatest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TestSASL: the source and the sink authenticate with PLAIN and SCRAM; a
// wrong password is a clear error when the connector opens.
func TestSASL(t *testing.T) {
	for _, mech := range []string{SASLPlain, SASLScramSHA256, SASLScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			c := kafkatest.Start(t, kfake.EnableSASL(), kfake.Superuser(mech, "streamd", "secret"), kfake.SeedTopics(2, "in", "out"))
			switch mech {
			case SASLPlain:
				c.ClientOpts = []kgo.Opt{kgo.SASL(plain.Auth{User: "streamd", Pass: "secret"}.AsMechanism())}
			case SASLScramSHA256:
				c.ClientOpts = []kgo.Opt{kgo.SASL(scram.Auth{User: "streamd", Pass: "secret"}.AsSha256Mechanism())}
			default:
				c.ClientOpts = []kgo.Opt{kgo.SASL(scram.Auth{User: "streamd", Pass: "secret"}.AsSha512Mechanism())}
			}
			produceN(t, c, "in", 2, 0, 10, 1_000)
			client := ClientConfig{Brokers: c.Brokers, SASLMechanism: mech, SASLUser: "streamd", SASLPassword: "secret"}
			cfg := srcConfig(c, "in")
			cfg.Client = client
			src, err := NewSource(testCtx(t), cfg, 0, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			if g := values(readN(t, src, 10)); !slices.Equal(g, wantValues(0, 10)) {
				t.Errorf("read %v", g)
			}
			scfg := sinkConfig(c, "out")
			scfg.Client = client
			sink, err := NewSink(testCtx(t), scfg, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			recs := recsN("s", 5)
			sink.Write(recs)
			sink.PreCommit(1)
			if err := commitNow(sink, 1); err != nil {
				t.Fatal(err)
			}
			exactlyOnce(t, c, "out", valuesOf(recs))

			cfg.Client.SASLPassword = "wrong"
			if _, err := NewSource(testCtx(t), cfg, 0, 1, nil); err == nil || !strings.Contains(err.Error(), "no broker of") {
				t.Errorf("wrong password: %v", err)
			}
		})
	}
}

// TestTLS: the source reads over TLS, trusting the CA of ca_file.
func TestTLS(t *testing.T) {
	caPEM, serverCfg := selfSigned(t)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	c := kafkatest.Start(t, kfake.TLS(serverCfg), kfake.SeedTopics(1, "in"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c.ClientOpts = []kgo.Opt{kgo.DialTLSConfig(&tls.Config{RootCAs: pool})}
	produceN(t, c, "in", 1, 0, 5, 1_000)
	cfg := srcConfig(c, "in")
	cfg.Client.TLSCAFile = caFile
	src, err := NewSource(testCtx(t), cfg, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if g := values(readN(t, src, 5)); !slices.Equal(g, wantValues(0, 5)) {
		t.Errorf("read %v", g)
	}
	cfg.Client.TLSCAFile = filepath.Join(dir, "missing.pem")
	if _, err := NewSource(testCtx(t), cfg, 0, 1, nil); err == nil || !strings.Contains(err.Error(), "ca_file") {
		t.Errorf("missing CA file: %v", err)
	}
}

// selfSigned makes a self-signed certificate for 127.0.0.1
// and localhost: its PEM and a server config with it.
func selfSigned(t *testing.T) ([]byte, *tls.Config) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}, DNSNames: []string{"localhost"},
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, &tls.Config{Certificates: []tls.Certificate{cert}}
}
