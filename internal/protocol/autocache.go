package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// AutoMemory remembers --lock-backend=auto's choice on disk, per API server,
// credentials and namespace, so that a deploy does not ask the API server
// three access reviews every time. An entry older than TTL is asked again;
// a choice of the lease backend that the API server then refuses is
// forgotten at once (Conn.ForgetAuto), so a right taken away costs one
// failed request, and a right granted is noticed within TTL.
type AutoMemory struct {
	// Dir holds one small file per entry, named by a hash of the server,
	// the credentials and the namespace (no secret is written).
	Dir string
	TTL time.Duration
	// id identifies the server and credentials; set by Conn.
	id  string
	now func() time.Time
}

// DefaultAutoTTL is how long a remembered choice is trusted.
const DefaultAutoTTL = time.Hour

// DefaultAutoMemory is the memory the CLI uses: under the user's cache
// folder ($XDG_CACHE_HOME/helm-autorecover/lock-backend); nil when the
// folder cannot be told.
func DefaultAutoMemory() *AutoMemory {
	dir, err := os.UserCacheDir()
	if err != nil {
		return nil
	}
	return &AutoMemory{Dir: filepath.Join(dir, "helm-autorecover", "lock-backend"), TTL: DefaultAutoTTL}
}

// identity is what tells one API server and one set of credentials from
// another in cfg, hashed into entry names.
func identity(cfg *rest.Config) string {
	if cfg == nil {
		return ""
	}
	parts := []string{
		cfg.Host, cfg.APIPath, cfg.Username, cfg.BearerToken, cfg.BearerTokenFile,
		cfg.CertFile, string(cfg.CertData), cfg.Impersonate.UserName, cfg.Impersonate.UID, strings.Join(cfg.Impersonate.Groups, ","),
	}
	if cfg.BearerTokenFile != "" {
		// In a pod every service account's token has the same path: the
		// token tells them apart (a rotated token only costs a new entry).
		if b, err := os.ReadFile(cfg.BearerTokenFile); err == nil {
			parts = append(parts, string(b))
		}
	}
	if cfg.ExecProvider != nil {
		parts = append(parts, cfg.ExecProvider.Command, strings.Join(cfg.ExecProvider.Args, " "))
		for _, e := range cfg.ExecProvider.Env {
			parts = append(parts, e.Name+"="+e.Value)
		}
	}
	if cfg.AuthProvider != nil {
		parts = append(parts, cfg.AuthProvider.Name)
	}
	return strings.Join(parts, "\x00")
}

func (m *AutoMemory) path(ns string) string {
	sum := sha256.Sum256([]byte(m.id + "\x00" + ns))
	return filepath.Join(m.Dir, hex.EncodeToString(sum[:16])+".json")
}

type autoEntry struct {
	Backend string    `json:"backend"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
}

// load returns the choice remembered for ns, if fresh.
func (m *AutoMemory) load(ns string) (Choice, bool) {
	if m == nil || m.Dir == "" {
		return Choice{}, false
	}
	b, err := os.ReadFile(m.path(ns))
	if err != nil {
		return Choice{}, false
	}
	var e autoEntry
	if json.Unmarshal(b, &e) != nil || (e.Backend != BackendLease && e.Backend != BackendRelease) {
		return Choice{}, false
	}
	if age := m.now().Sub(e.At); age < 0 || age > m.TTL {
		return Choice{}, false
	}
	return Choice{Backend: e.Backend, Reason: e.Reason + " (remembered from " + e.At.UTC().Format(time.RFC3339) + ")"}, true
}

// store remembers ch for ns; failures only cost the next run its reviews.
func (m *AutoMemory) store(ns string, ch Choice) {
	if m == nil || m.Dir == "" {
		return
	}
	b, err := json.Marshal(autoEntry{Backend: ch.Backend, Reason: ch.Reason, At: m.now()})
	if err != nil || os.MkdirAll(m.Dir, 0o700) != nil {
		return
	}
	// Written whole then renamed: a concurrent reader sees the old entry or
	// the new one, never half of one.
	tmp, err := os.CreateTemp(m.Dir, ".entry-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Rename(tmp.Name(), m.path(ns)) != nil {
		_ = os.Remove(tmp.Name())
	}
}

func (m *AutoMemory) forget(ns string) {
	if m == nil || m.Dir == "" {
		return
	}
	_ = os.Remove(m.path(ns))
}
