package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// series is one sample of Prometheus' text format.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

// promText is a scrape.
type promText []series

func scrape(url string) (promText, error) {
	c := http.Client{Timeout: 10 * time.Second}
	res, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return parseProm(res.Body)
}

// parseProm reads Prometheus' text exposition format (samples only).
func parseProm(r io.Reader) (promText, error) {
	var out promText
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s := series{labels: map[string]string{}}
		i := strings.IndexAny(line, "{ ")
		if i < 0 {
			continue
		}
		s.name = line[:i]
		rest := line[i:]
		if rest[0] == '{' {
			end, err := parseLabels(rest, s.labels)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", line, err)
			}
			rest = rest[end:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// parseLabels parses {a="b",...} at the start of s into into and returns
// the index just past the closing brace.
func parseLabels(s string, into map[string]string) (int, error) {
	i := 1
	for i < len(s) {
		for i < len(s) && (s[i] == ',' || s[i] == ' ') {
			i++
		}
		if i < len(s) && s[i] == '}' {
			return i + 1, nil
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 || i+eq+1 >= len(s) || s[i+eq+1] != '"' {
			return 0, fmt.Errorf("bad labels")
		}
		key := s[i : i+eq]
		i += eq + 2
		var b strings.Builder
		for i < len(s) && s[i] != '"' {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i])
				}
			} else {
				b.WriteByte(s[i])
			}
			i++
		}
		into[key] = b.String()
		i++ // closing quote
	}
	return 0, fmt.Errorf("unterminated labels")
}

// sum adds the samples of name whose labels include match.
func (m promText) sum(name string, match map[string]string) float64 {
	t := 0.0
	for _, s := range m {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			t += s.value
		}
	}
	return t
}

// bucket is one cumulative histogram bucket.
type bucket struct {
	le    float64
	count float64
}

func (m promText) buckets(name string) []bucket {
	var bs []bucket
	for _, s := range m {
		if s.name != name+"_bucket" {
			continue
		}
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, s.value})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	return bs
}

// quantile is Prometheus' histogram_quantile over cumulative buckets:
// linear interpolation inside the bucket the rank falls in (from 0 for
// the first); a rank in the +Inf bucket gives the highest finite bound.
// It also returns that bucket's upper bound, what the histogram can
// actually promise.
func quantile(q float64, bs []bucket) (est, upper float64, ok bool) {
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0, 0, false
	}
	total := bs[len(bs)-1].count
	rank := q * total
	prevLE, prevCount := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return prevLE, math.Inf(1), true
			}
			if b.count == prevCount {
				return b.le, b.le, true
			}
			return prevLE + (b.le-prevLE)*(rank-prevCount)/(b.count-prevCount), b.le, true
		}
		prevLE, prevCount = b.le, b.count
	}
	return prevLE, prevLE, true
}

// requestTotals sums apiserver_request_total by verb and resource
// (resource.group/subresource, as countproxy.Classify names them).
func requestTotals(m promText) map[reqKey]float64 {
	out := map[reqKey]float64{}
	for _, s := range m {
		if s.name != "apiserver_request_total" {
			continue
		}
		res := s.labels["resource"]
		if g := s.labels["group"]; g != "" {
			res += "." + g
		}
		if sub := s.labels["subresource"]; sub != "" {
			res += "/" + sub
		}
		if res == "" {
			res = "(non-resource)"
		}
		out[reqKey{Verb: strings.ToLower(s.labels["verb"]), Resource: res}] += s.value
	}
	return out
}
