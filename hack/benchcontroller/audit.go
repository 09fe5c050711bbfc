package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"strings"
)

// auditEvent is what the bench reads of an audit log line.
type auditEvent struct {
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		APIGroup    string `json:"apiGroup"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
}

// auditSize is the size of the audit log now (0 if absent).
func auditSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readAudit counts the requests the audit log recorded between byte
// offsets from and to whose user agent match accepts (the controller's),
// by verb and resource. rotated says the log was rotated in between (the
// count then misses what went to the rotated file).
func readAudit(path string, from, to int64, match func(userAgent string) bool) (counts map[reqKey]int, rotated bool, err error) {
	counts = map[reqKey]int{}
	f, err := os.Open(path)
	if err != nil {
		return counts, false, err
	}
	defer func() { _ = f.Close() }()
	if to < from {
		rotated, from = true, 0
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return counts, rotated, err
	}
	sc := bufio.NewScanner(io.LimitReader(f, to-from))
	sc.Buffer(make([]byte, 4<<20), 4<<20)
	for sc.Scan() {
		var e auditEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Stage != "ResponseComplete" || !match(e.UserAgent) {
			continue
		}
		res := ""
		if e.ObjectRef != nil {
			res = e.ObjectRef.Resource
			if e.ObjectRef.APIGroup != "" {
				res += "." + e.ObjectRef.APIGroup
			}
			if e.ObjectRef.Subresource != "" {
				res += "/" + e.ObjectRef.Subresource
			}
		}
		counts[reqKey{Verb: strings.ToLower(e.Verb), Resource: res}]++
	}
	return counts, rotated, sc.Err()
}
