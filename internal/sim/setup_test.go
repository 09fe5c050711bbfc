package sim

import (
	"bytes"
	"context"
	"reflect"
	"testing"
	"testing/synctest"
	"time"
)

// TestSetupRestored: the setup's install is the same in every schedule, so
// a schedule restores it from the first run instead of running it again.
// Two real runs must leave the same model, client result and virtual time,
// and a restored setup the same as a real one.
func TestSetupRestored(t *testing.T) {
	fresh := func() setupRun {
		var out setupRun
		synctest.Test(t, func(t *testing.T) {
			m, start := NewModel(), time.Now()
			out.result = runClient(context.Background(), m, setupPlan, Faults{}, 0)
			out.elapsed, out.state = time.Since(start), m.save()
			m.Close()
		})
		return out
	}
	restored := func() setupRun {
		var out setupRun
		synctest.Test(t, func(t *testing.T) {
			m, start := NewModel(), time.Now()
			out.result = setup(context.Background(), m)
			out.elapsed, out.state = time.Since(start), m.save()
			m.Close()
		})
		return out
	}
	a, b := fresh(), fresh()
	sameRun(t, "two real setups", a, b)
	if a.result.Err != nil || a.state.rv == 0 || len(a.state.writes) == 0 {
		t.Fatalf("the setup did not install: err %v, %d writes", a.result.Err, len(a.state.writes))
	}
	setups.Lock()
	setups.done = false
	setups.Unlock()
	first := restored() // runs it and keeps it
	setups.Lock()
	kept := setups.done
	setups.Unlock()
	if !kept {
		t.Fatal("the setup's outcome was not kept")
	}
	sameRun(t, "a real setup and the first through setup()", a, first)
	sameRun(t, "a real setup and a restored one", a, restored())
}

// setupRun is what one setup left: the model's data, the client's result
// and the virtual time it took.
type setupRun struct {
	state   modelState
	result  Result
	elapsed time.Duration
}

func sameRun(t *testing.T, what string, a, b setupRun) {
	t.Helper()
	sa, sb := a.state, b.state
	if sa.rv != sb.rv || len(sa.objs) != len(sb.objs) || len(sa.events) != len(sb.events) || !reflect.DeepEqual(sa.requests, sb.requests) {
		t.Fatalf("%s: rv %d/%d, %d/%d objects, %d/%d events, requests %v/%v", what, sa.rv, sb.rv, len(sa.objs), len(sb.objs), len(sa.events), len(sb.events), sa.requests, sb.requests)
	}
	for k, o := range sa.objs {
		if p, ok := sb.objs[k]; !ok || p.rv != o.rv || !bytes.Equal(p.raw, o.raw) {
			t.Fatalf("%s: object %v differs:\n%s\n%s", what, k, o.raw, p.raw)
		}
	}
	for i, e := range sa.events {
		if f := sb.events[i]; f.typ != e.typ || f.k != e.k || f.rv != e.rv || !bytes.Equal(f.raw, e.raw) {
			t.Fatalf("%s: event %d differs", what, i)
		}
	}
	if !reflect.DeepEqual(sa.writes, sb.writes) {
		t.Fatalf("%s: the writes differ:\n%+v\n%+v", what, sa.writes, sb.writes)
	}
	if !reflect.DeepEqual(a.result, b.result) {
		t.Fatalf("%s: the client's result differs:\n%+v\n%+v", what, a.result, b.result)
	}
	if a.elapsed != b.elapsed {
		t.Fatalf("%s: it took %v, then %v of virtual time", what, a.elapsed, b.elapsed)
	}
}
