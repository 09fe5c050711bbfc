package sqlstore

import (
	"fmt"
	"net/url"
	"os"
	"strings"
)

// WithSession returns the connection string dsn (a URL or key=value pairs,
// as lib/pq and so helm take it) with the lock session put into the
// connection's options, so that every write helm makes through it is made
// for session, and refused by the trigger unless session holds the
// release's lock row. A session named there before is replaced; the
// connection's other options are kept, and when dsn names none, those of
// PGOPTIONS, which lib/pq reads only when dsn names none.
//
// No limit is put on a transaction left idle: helm's sql driver ignores a
// failed commit of its create, so a transaction the server ended would
// lose the revision while helm carried on.
func WithSession(dsn, session string) (string, error) {
	if dsn == "" {
		return "", ErrNoConnectionString
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("%s is not a URL lib/pq reads: %w", EnvConnectionString, err)
		}
		q := u.Query()
		opts, ok := q["options"]
		base := os.Getenv("PGOPTIONS")
		if ok && len(opts) > 0 {
			base = opts[len(opts)-1]
		}
		q.Set("options", withOption(base, session))
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	pairs, err := parsePairs(dsn)
	if err != nil {
		return "", fmt.Errorf("%s: %w", EnvConnectionString, err)
	}
	set := false
	for i := range pairs {
		if pairs[i][0] == "options" {
			pairs[i][1] = withOption(pairs[i][1], session)
			set = true
		}
	}
	if !set {
		pairs = append(pairs, [2]string{"options", withOption(os.Getenv("PGOPTIONS"), session)})
	}
	var b strings.Builder
	for i, p := range pairs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p[0])
		b.WriteByte('=')
		b.WriteString(quote(p[1]))
	}
	return b.String(), nil
}

// withOption sets the session setting in a server options string ("-c
// name=value ..."), dropping an earlier setting of it.
func withOption(options, session string) string {
	prefix := settingSession + "="
	var kept []string
	fields := strings.Fields(options)
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		switch {
		case f == "-c" && i+1 < len(fields) && strings.HasPrefix(fields[i+1], prefix):
			i++
			continue
		case strings.HasPrefix(f, "-c"+prefix), strings.HasPrefix(f, "--"+strings.ReplaceAll(prefix, "_", "-")), strings.HasPrefix(f, "--"+prefix):
			continue
		}
		kept = append(kept, f)
	}
	kept = append(kept, "-c", prefix+session)
	return strings.Join(kept, " ")
}

// parsePairs reads lib/pq's key=value form: values bare or single-quoted,
// with backslash escapes inside quotes.
func parsePairs(s string) ([][2]string, error) {
	var out [][2]string
	i := 0
	skip := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skip()
		if i >= len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' {
			i++
		}
		key := s[start:i]
		skip()
		if key == "" || i >= len(s) || s[i] != '=' {
			return nil, fmt.Errorf("%q is not a key=value pair", s[start:min(len(s), i+1)])
		}
		i++
		skip()
		var val strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				i++
				if c == '\\' && i < len(s) {
					val.WriteByte(s[i])
					i++
					continue
				}
				if c == '\'' {
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return nil, fmt.Errorf("the value of %q has no closing quote", key)
			}
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				val.WriteByte(s[i])
				i++
			}
		}
		out = append(out, [2]string{key, val.String()})
	}
}

// quote writes a value so that lib/pq reads it back unchanged.
func quote(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// withDefault returns dsn (a URL or key=value pairs) with key set to value
// when dsn sets none.
func withDefault(dsn, key, value string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("%s is not a URL lib/pq reads: %w", EnvConnectionString, err)
		}
		q := u.Query()
		if q.Has(key) {
			return dsn, nil
		}
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	pairs, err := parsePairs(dsn)
	if err != nil {
		return "", fmt.Errorf("%s: %w", EnvConnectionString, err)
	}
	for _, p := range pairs {
		if p[0] == key {
			return dsn, nil
		}
	}
	return dsn + " " + key + "=" + quote(value), nil
}
