// Package e2e holds end-to-end scenarios that run real helm and
// helm-autorecover binaries against the local control plane and kill them
// for real.
package e2e

import (
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
