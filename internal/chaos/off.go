//go:build !chaos

package chaos

import (
	"net/http"
	"time"
)

// Enabled reports whether this is a chaos build.
const Enabled = false

// Point does nothing outside chaos builds.
func Point(string) {}

// Classify does nothing outside chaos builds.
func Classify(*http.Request) string { return "" }

// Answered does nothing outside chaos builds.
func Answered(string, *http.Response, error) {}

// ClockOffset is zero outside chaos builds.
func ClockOffset() time.Duration { return 0 }

// Suspended is zero outside chaos builds.
func Suspended() time.Duration { return 0 }

// Now is time.Now() outside chaos builds.
func Now() time.Time { return time.Now() }
