package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// AuditEvent is the part of an audit.k8s.io/v1 Event the tests and the
// fault suite read from the local cluster's audit log.
type AuditEvent struct {
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	ObjectRef *struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	ImpersonatedUser *struct {
		Username string `json:"username"`
	} `json:"impersonatedUser"`
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
	StageTimestamp  time.Time `json:"stageTimestamp"`
}

// ReadAuditWrites returns the successful writes in ns to secrets and leases
// by an impersonated user (ImpersonatingKubeconfig), in log order. The local
// cluster writes its audit log in blocking mode: a write is in it by the
// time its client has the answer.
func ReadAuditWrites(path, ns string) ([]AuditEvent, error) {
	return ReadAuditWritesOf(path, ns, "secrets", "leases")
}

// ReadAuditWritesOf is ReadAuditWrites for writes to the given resources
// (the local cluster audits secrets, configmaps and leases).
func ReadAuditWritesOf(path, ns string, resources ...string) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer func() { _ = f.Close() }()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	// Most of the log is other namespaces': a line that does not name ns
	// anywhere is skipped before it is decoded.
	quoted := []byte(`"` + ns + `"`)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), quoted) {
			continue
		}
		var e AuditEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Stage != "ResponseComplete" || e.ObjectRef == nil || e.ObjectRef.Namespace != ns {
			continue
		}
		switch e.Verb {
		case "create", "update", "patch", "delete":
		default:
			continue
		}
		if !slices.Contains(resources, e.ObjectRef.Resource) {
			continue
		}
		if e.ResponseStatus == nil || e.ResponseStatus.Code >= 300 || e.ImpersonatedUser == nil {
			continue
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading audit log %s: %w", path, err)
	}
	return out, nil
}

// AuditLog is the path of the local cluster's audit log
// ($LOCAL_CLUSTER_DIR/logs/audit.log, by default under .local-cluster/ in
// the repository).
func AuditLog() string {
	dir := os.Getenv("LOCAL_CLUSTER_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), ".local-cluster")
	}
	return filepath.Join(dir, "logs", "audit.log")
}

// ImpersonatingKubeconfig writes into dir a copy of the admin kubeconfig
// admin whose every user impersonates user (in group system:masters, so it
// has the admin's rights): the audit log then names user as the
// impersonated user of every request made with it, helm's and the lock's.
func ImpersonatingKubeconfig(admin, dir, user string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		return "", fmt.Errorf("loading %s: %w", admin, err)
	}
	// Relative certificate paths stay valid in the copy.
	if err := clientcmd.ResolveLocalPaths(cfg); err != nil {
		return "", fmt.Errorf("resolving the paths of %s: %w", admin, err)
	}
	if len(cfg.AuthInfos) == 0 {
		return "", fmt.Errorf("%s has no user to impersonate from", admin)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = user
		ai.ImpersonateGroups = []string{"system:masters"}
	}
	path := filepath.Join(dir, "kubeconfig-"+user)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return path, nil
}
