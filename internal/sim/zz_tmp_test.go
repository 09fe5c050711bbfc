//go:build sim

package sim

import (
	"sort"
	"testing"
)

func TestTmpHist(t *testing.T) {
	type sr struct {
		seed int64
		n    int
		dur  string
	}
	var all []sr
	tot := 0
	for seed := int64(1); seed <= 500; seed++ {
		o := runOne(t, Draw(seed))
		n := 0
		for _, v := range o.Requests {
			n += v
		}
		tot += n
		end := o.Final.Ended.Sub(o.Start).String()
		all = append(all, sr{seed, n, end})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n })
	t.Logf("total %d", tot)
	acc := 0
	for i, s := range all {
		acc += s.n
		if i < 25 || i%50 == 0 {
			t.Logf("#%d seed %d requests %d virtual %s cum %.2f", i, s.seed, s.n, s.dur, float64(acc)/float64(tot))
		}
	}
}
