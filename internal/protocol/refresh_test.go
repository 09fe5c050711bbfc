package protocol

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// resettingMapper counts Reset calls.
type resettingMapper struct {
	meta.RESTMapper
	resets int
}

func (m *resettingMapper) Reset() { m.resets++ }

// TestRefreshDiscovery: a long-running process forgets the kinds it
// learned, so a kind installed since (a CRD) is known to the next recovery.
func TestRefreshDiscovery(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	m := &resettingMapper{RESTMapper: meta.NewDefaultRESTMapper(nil)}
	c := NewConn(fake.NewClientset(), servertime.New(clk), clk, "", func() (*recovery.Kube, error) {
		return &recovery.Kube{Mapper: m}, nil
	})
	c.RefreshDiscovery()
	c.RefreshDiscovery()
	if m.resets != 2 {
		t.Errorf("Reset called %d times, want 2", m.resets)
	}
}
