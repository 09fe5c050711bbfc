//go:build sim

package sim

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	flagN        = flag.Int("sim.n", 2000, "random schedules to explore")
	flagFrom     = flag.Int64("sim.seed", 1, "the first random schedule's seed")
	flagShard    = flag.String("sim.shard", "0/1", "explore only the seeds i mod n (i/n), to spread them over processes")
	flagTrace    = flag.Bool("sim.trace", false, "print every schedule's trace")
	flagProgress = flag.Bool("sim.progress", false, "print each seed as it starts, to stderr")
	flagClaims   = flag.String("sim.claims", "", "share the seeds with the other processes given this directory: each takes the next block of seeds no one took yet (instead of -sim.shard), so that all end together")
)

// claimBlock is how many seeds a process takes at once with -sim.claims.
const claimBlock = 50

// seeds returns the seeds this process explores, in order, as a function
// that returns the next one (false when none is left).
func seeds(t *testing.T) func() (int64, bool) {
	from, end := *flagFrom, *flagFrom+int64(*flagN)
	if *flagClaims == "" {
		i, of := shard()
		seed := from - 1
		return func() (int64, bool) {
			for seed++; seed < end; seed++ {
				if seed%of == i {
					return seed, true
				}
			}
			return 0, false
		}
	}
	block, next, last := int64(-1), from, from
	return func() (int64, bool) {
		for next >= last {
			// Take the next block that no process created a file for.
			for {
				block++
				if from+block*claimBlock >= end {
					return 0, false
				}
				f, err := os.OpenFile(filepath.Join(*flagClaims, strconv.FormatInt(block, 10)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
				if errors.Is(err, fs.ErrExist) {
					continue
				}
				if err != nil {
					t.Fatalf("claiming seeds: %v", err)
				}
				_ = f.Close()
				break
			}
			next, last = from+block*claimBlock, min(from+(block+1)*claimBlock, end)
		}
		next++
		return next - 1, true
	}
}

func shard() (int64, int64) {
	i, n, ok := strings.Cut(*flagShard, "/")
	a, err1 := strconv.ParseInt(i, 10, 64)
	b, err2 := strconv.ParseInt(n, 10, 64)
	if !ok || err1 != nil || err2 != nil || b < 1 || a < 0 || a >= b {
		panic("-sim.shard must be i/n with 0 <= i < n")
	}
	return a, b
}

// This file is built only with -tags sim (make sim): the random exploration
// runs for minutes, and reports the violations it finds that are not fixed
// yet (docs/reliability.md lists them); make test runs the exhaustive set and
// the regressions.

// TestSimRandom explores random schedules (make sim: 100,000 of them).
func TestSimRandom(t *testing.T) {
	next := seeds(t)
	var ty tally
	start := time.Now()
	for seed, ok := next(); ok; seed, ok = next() {
		if *flagProgress {
			fmt.Fprintf(os.Stderr, "sim: seed %d\n", seed)
		}
		o := runOne(t, Draw(seed))
		ty.add(o)
		if *flagTrace {
			t.Log(o.Trace())
		}
		if len(o.Violations) > 0 {
			t.Errorf("seed %d: %d violations (replay: go test -tags sim ./internal/sim -run 'TestSimRandom$' -sim.seed=%d -sim.n=1 -sim.trace):\n%s", seed, len(o.Violations), seed, o.Trace())
		}
	}
	report(t, "random", &ty, time.Since(start))
}
