package wire

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"time"
)

var HostIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// MaxSlots is the most slots one host may offer.
const MaxSlots = 1024

// NewHostID is a host id for a host that names none: the hostname (with
// characters other than letters, digits, '-' and '_' replaced by '_')
// followed by a random suffix.
func NewHostID() string {
	name, _ := os.Hostname()
	name = regexp.MustCompile(`[^A-Za-z0-9_-]+`).ReplaceAllString(name, "_")
	var b [3]byte
	_, _ = rand.Read(b[:])
	return name + "-" + hex.EncodeToString(b[:])
}

// Defaults of ControllerOptions.
const (
	DefaultHeartbeatInterval = time.Second
	DefaultRequestTimeout    = 10 * time.Second
)
